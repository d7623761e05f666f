"""Tools for working on the kernels, each a `flashcute` command: `compare` (this tree against an earlier commit),
`tune` (a heuristic's config against overrides), `sanitize` (compute-sanitizer over every kind of kernel) and
`power` (energy a call at the power cap). Each module has ``add_arguments(parser)`` and ``run(args) -> int``."""

"""`python -m flashcute.bench`: the same command as `flashcute bench`."""

from flashcute.bench.cli import main

raise SystemExit(main())

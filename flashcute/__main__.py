"""`python -m flashcute`: the same command as `flashcute`."""

from flashcute.cli import main

raise SystemExit(main())

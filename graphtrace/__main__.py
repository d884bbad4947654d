"""``python -m graphtrace``: the same command line as ``graphtrace``."""

from graphtrace.cli import main

raise SystemExit(main())

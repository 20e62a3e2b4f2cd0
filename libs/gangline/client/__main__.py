"""``python -m gangline.client SUBCOMMAND``."""

from gangline.client.commands import main

raise SystemExit(main())

from idempotent.cli import main

raise SystemExit(main())

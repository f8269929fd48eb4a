from torchtriage.cli import main

raise SystemExit(main())

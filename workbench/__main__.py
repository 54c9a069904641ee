from workbench.cli import main

raise SystemExit(main())

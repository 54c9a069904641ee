from workbench.train.loop import main

raise SystemExit(main())

from lmrepro.cli import main

raise SystemExit(main())

from pipeprof.cli import main

raise SystemExit(main())

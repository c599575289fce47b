import sys

from .cli import main, opinfo, serve

argv = sys.argv[1:]
sys.exit(serve() if argv == ["--serve"] else opinfo(argv[1:]) if argv[:1] == ["opinfo"] else main())

import sys

from .cli import main, serve

sys.exit(serve() if sys.argv[1:] == ["--serve"] else main())

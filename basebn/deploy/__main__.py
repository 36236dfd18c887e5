"""`python -m basebn.deploy`: the export CLI (basebn.deploy.cli)."""
import sys

from .cli import main

sys.exit(main())

"""`python -m export.commands NAME [options]`: a command as a child process (the device check's sections, the
fuzzer)."""

import sys

from export.commands import main

sys.exit(main())

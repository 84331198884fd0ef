"""`python -m plugins.native`: build the native CPU plugins now (scripts/setup.sh runs it) and say which kernels
this CPU runs, or in one line why they cannot be built (exit 0 either way: the runtime then uses the cpu backend)."""

import sys

from plugins import native

if __name__ == "__main__":
    reason = native.unavailable()
    if reason:
        print(f"bitnest-edge: native CPU plugins unavailable ({reason}); the cpu backend will be used", file=sys.stderr)
    else:
        print(f"bitnest-edge: native CPU plugins built ({native.best_isa()} kernels; this CPU runs "
              f"{', '.join(native.runnable_isas())})")
    sys.exit(0)

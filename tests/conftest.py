"""Test-session settings: deterministic, and robust on a loaded 2-core machine."""

import os

# OpenMP threads that spin while waiting make tiny tensor ops hundreds of times slower when
# another process holds the other core; a passive wait policy avoids that.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

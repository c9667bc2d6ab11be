#!/usr/bin/env bash
# Stop the local cluster started by start_local_cluster.sh: exactly its processes, by process-group id
# (not `ray stop`, which would also kill every other Ray on this machine); says what it waits for.
# Options: --dir D, --grace SECONDS (between SIGTERM and SIGKILL, default 20).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-$(command -v python3)}"
exec "$python" "$here/local_cluster.py" stop "$@"

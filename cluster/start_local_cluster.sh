#!/usr/bin/env bash
# Start a local multi-node Ray cluster on this machine: a head and N worker nodes (default 2), loopback only,
# token authentication on. Options go to cluster/local_cluster.py start (--workers N, --cpus-per-node C,
# --port P, --dashboard-port P, --dir D (private; default ~/.ldpfed/cluster), --timeout S, --attempts N).
# Then: source ~/.ldpfed/cluster/env.sh; ray job submit -- python ...
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-$(command -v python3)}"
exec "$python" "$here/local_cluster.py" start "$@"

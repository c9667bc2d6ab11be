#!/usr/bin/env bash
# A real multi-node Ray cluster on ONE Linux machine, for testing `ray up ray_config.yaml` end to end:
# every node is a network namespace with its own address on a private bridge, reached over SSH, running the
# unmodified launcher config (only head_ip, worker_ips, ssh_user and ssh_private_key are filled in).
#
#   sudo cluster/netns_cluster.sh up      # namespaces, bridge, sshd per node, then `ray up`
#   sudo cluster/netns_cluster.sh test    # `ray dashboard` tunnel + `ray job submit` of cluster/placement_job.py
#                                         # (runs over the direct transport, its sockets between the nodes' addresses)
#   sudo cluster/netns_cluster.sh down    # `ray down`, then removes everything `up` created
#   sudo cluster/netns_cluster.sh all     # up, test, down; cleans up even when a step fails (exit code = result)
#
# Needs root, iproute2 (`ip netns`), util-linux (`unshare`), openssh-server/client and rsync
# (Debian: apt-get install -y openssh-server openssh-client rsync), and a Python with ray and ldpfed
# (PYTHON, default: the one running `ray` on PATH, e.g. .venv/bin/python).
#
# Layout (addresses only inside namespaces this script creates; nothing is added to the machine's own network):
#   ${NS}sw    the switch: a bridge br0, one veth per node
#   ${NS}ctl   the launching machine, 10.200.77.10: runs ray up / ray dashboard / ray job submit / ray down
#   ${NS}head  10.200.77.1, ${NS}w1 10.200.77.2, ${NS}w2 10.200.77.3 ... (WORKERS, default 2): one sshd each
# Each node (and each ctl command) also runs in its own PID and mount namespace: its own /proc (so the config's
# `ray stop` sees only that node's processes, never the machine's other Ray instances), its own home directory
# (/root, bind-mounted from the state directory: the synced repository, ~/.ray/auth_token, the bootstrap key)
# and its own /tmp (Ray's session files). Every node's home has ~/ldpfed-venv -> this machine's venv, so the
# config's setup command finds Ray installed and downloads nothing (the namespaces have no other network).
# Killing a namespace's first process kills everything in it: that is how `down` stops sshd and Ray for sure.
#
# State, keys and logs: $STATE (default /run/ldpfed-netns, mode 0700); `down` removes it (KEEP_LOGS=1 keeps a
# copy of the logs in $STATE.logs).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
NS="${NS:-ldpfed-nn-}"
SUBNET="${SUBNET:-10.200.77}"
WORKERS="${WORKERS:-2}"
STATE="${STATE:-/run/ldpfed-netns}"
RAY="${RAY:-$(command -v ray || true)}"
PYTHON="${PYTHON:-$(dirname "${RAY:-/x}")/python}"
VENV="$(cd "$(dirname "$PYTHON")/.." 2>/dev/null && pwd || true)"
TIMEOUT="${TIMEOUT:-900}"          # seconds for `ray up` (slow on a busy 2-core machine)
JOB_ARGS="${JOB_ARGS:-}"           # more arguments for cluster/placement_job.py (e.g. --compare-ray)
# The launcher's autoscaler v1 (Ray 2.60 defaults to v2). Seen here at load ~27 on 2 cores: v2 launched the
# workers one at a time and, once the first one's start had failed, terminated it and launched neither worker
# again; v1 launches them together. Neither starts a failed local-provider node again, which is why
# ray_config.yaml's start commands retry `ray start` themselves. Set RAY_UP_enable_autoscaler_v2=1 to use v2.
export RAY_UP_enable_autoscaler_v2="${RAY_UP_enable_autoscaler_v2:-0}"
# the Python installation the venv is built on, if it lives under /root (which each node replaces by its own home)
PYTHON_UNDER_ROOT="$("$PYTHON" -c 'import sys; print(sys.base_prefix)' 2>/dev/null | grep '^/root/' || true)"

nodes() { echo head; for i in $(seq 1 "$WORKERS"); do echo "w$i"; done; }
node_ip() { if [ "$1" = head ]; then echo "$SUBNET.1"; elif [ "$1" = ctl ]; then echo "$SUBNET.10"; \
            else echo "$SUBNET.$(( ${1#w} + 1 ))"; fi; }
log() { echo "[netns_cluster $(date -u +%H:%M:%S)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

check_prerequisites() {
    [ "$(id -u)" = 0 ] || die "needs root (network namespaces, sshd)"
    ip netns list >/dev/null 2>&1 || die "\`ip netns\` is unavailable"
    for tool in unshare /usr/sbin/sshd ssh ssh-keygen rsync; do
        command -v "$tool" >/dev/null || die "$tool is missing (apt-get install -y openssh-server openssh-client rsync)"
    done
    [ -x "$RAY" ] && [ -x "$PYTHON" ] || die "no ray/python found (set RAY=/path/to/venv/bin/ray)"
    "$PYTHON" -c "import ldpfed, ray" || die "$PYTHON cannot import ldpfed and ray"
}

# Run a command inside namespace $1 (network) with its own PID and mount namespace, /root and /tmp bound to
# $STATE/$1/{home,tmp}. --kill-child: when this wrapper dies, everything started inside dies with it.
# The Python installation under /root (e.g. pyenv's), if any, stays visible inside at the same path.
in_ns() {
    local name="$1"; shift
    ip netns exec "$NS$name" unshare --pid --fork --kill-child --mount --propagation private --mount-proc \
        bash -c 'home="$0/home"
                 if [ -n "$2" ]; then mkdir -p "$home/${2#/root/}" && mount --bind "$2" "$home/${2#/root/}"; fi
                 mount --rbind "$home" /root && mount --bind "$0/tmp" /tmp && cd "$1" && shift 2 && exec "$@"' \
        "$STATE/$name" "$repo" "$PYTHON_UNDER_ROOT" "$@"
}

make_node_dirs() {   # $1 = node name
    local dir="$STATE/$1"
    mkdir -p "$dir/home/.ray" "$dir/tmp"
    chmod 700 "$dir" "$dir/home" "$dir/home/.ray"
    chmod 1777 "$dir/tmp"
    ln -sfn "$VENV" "$dir/home/ldpfed-venv"
    : > "$dir/home/.bashrc"          # the launcher runs `source ~/.bashrc` before every command
}

up() {
    check_prerequisites
    if [ -e "$STATE" ]; then die "$STATE exists: a cluster is up (run \`$0 down\` first)"; fi
    mkdir -m 700 "$STATE"
    : > "$STATE/pids"
    log "namespaces ${NS}sw, ${NS}ctl, $(nodes | sed "s/^/$NS/" | tr '\n' ' ')on $SUBNET.0/24"
    ip netns add "${NS}sw"
    echo "netns ${NS}sw" >> "$STATE/created"
    ip -n "${NS}sw" link add br0 type bridge
    ip -n "${NS}sw" link set br0 up
    ip -n "${NS}sw" link set lo up
    ssh-keygen -q -t ed25519 -N "" -C ldpfed-netns -f "$STATE/id_ed25519"
    for name in ctl $(nodes); do
        ip netns add "$NS$name"
        echo "netns $NS$name" >> "$STATE/created"
        # veth pair created directly in its two namespaces: nothing appears in the machine's own namespace
        ip link add "eth0" netns "$NS$name" type veth peer name "v-$name" netns "${NS}sw"
        ip -n "${NS}sw" link set "v-$name" master br0 up
        ip -n "$NS$name" addr add "$(node_ip "$name")/24" dev eth0
        ip -n "$NS$name" link set eth0 up
        ip -n "$NS$name" link set lo up
        # a default route, as a real machine has: Ray finds a node's own address by the route to the outside
        # (without one it falls back to 127.0.0.1 and the workers look for the head on their own loopback). It
        # leads only onto the bridge, which has no uplink: nothing leaves the namespaces.
        ip -n "$NS$name" route add default dev eth0
        make_node_dirs "$name"
    done
    mkdir -p /run/sshd && chmod 755 /run/sshd       # sshd's privilege-separation directory
    for name in $(nodes); do
        local dir="$STATE/$name"
        ssh-keygen -q -t ed25519 -N "" -f "$dir/ssh_host_ed25519_key"
        cp "$STATE/id_ed25519.pub" "$dir/authorized_keys"
        chmod 600 "$dir/authorized_keys"
        cat > "$dir/sshd_config" <<EOF
ListenAddress $(node_ip "$name"):22
HostKey $dir/ssh_host_ed25519_key
PidFile $dir/sshd.pid
AuthorizedKeysFile $dir/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes yes
AllowTcpForwarding yes
Subsystem sftp internal-sftp
EOF
        # bash is the namespace's first process (it reaps the Ray daemons that sshd sessions leave behind)
        in_ns "$name" bash -c '/usr/sbin/sshd -D -e -f "$1" & wait' bash "$dir/sshd_config" \
            > "$dir/sshd.log" 2>&1 &
        echo "node $name $!" >> "$STATE/pids"
    done
    # the launching machine's token, private, in ctl's home (the config's file_mounts copies ~/.ray/auth_token)
    HOME="$STATE/ctl/home" "$PYTHON" "$here/local_cluster.py" token >/dev/null
    # the launcher config: ray_config.yaml with the addresses, user and key filled in, nothing else changed
    "$PYTHON" - "$repo/ray_config.yaml" "$STATE/ray_config.yaml" "$(node_ip head)" "$STATE/id_ed25519" \
        $(for n in $(nodes | tail -n +2); do node_ip "$n"; done) <<'EOF'
import sys, yaml
source, target, head, key, *workers = sys.argv[1:]
config = yaml.safe_load(open(source))
config["provider"].update(head_ip=head, worker_ips=workers)
config["auth"] = {"ssh_user": "root", "ssh_private_key": key}
config["max_workers"] = len(workers)
yaml.safe_dump(config, open(target, "w"), sort_keys=False)
EOF
    for name in $(nodes); do    # sshd up in every node, reachable from ctl
        local ok=""
        for _ in $(seq 1 60); do
            if in_ns ctl ssh -q -i "$STATE/id_ed25519" -o BatchMode=yes -o StrictHostKeyChecking=no \
                -o UserKnownHostsFile=/dev/null -o ConnectTimeout=3 "root@$(node_ip "$name")" true 2>/dev/null; then
                ok=1; break
            fi
            sleep 1
        done
        [ -n "$ok" ] || die "sshd of $name is not reachable; see $STATE/$name/sshd.log"
    done
    log "sshd up on every node; ray up (log: $STATE/ray_up.log)"
    if ! in_ns ctl timeout "$TIMEOUT" "$RAY" up -y --no-config-cache "$STATE/ray_config.yaml" \
            > "$STATE/ray_up.log" 2>&1; then
        tail -n 40 "$STATE/ray_up.log" >&2
        die "ray up failed; see $STATE/ray_up.log"
    fi
    wait_for_nodes $(( WORKERS + 1 ))
    log "cluster up: head $(node_ip head), workers $(for n in $(nodes | tail -n +2); do node_ip "$n"; done | tr '\n' ' ')"
}

# Ray's own count of alive nodes, asked on the head through the launcher (`ray exec`), on one marked line.
alive_nodes() {
    in_ns ctl "$RAY" exec "$STATE/ray_config.yaml" \
        "RAY_AUTH_MODE=token ~/ldpfed-venv/bin/python -c \"import ray; ray.init(address='auto', logging_level='ERROR'); print('ALIVE_NODES', sum(n['Alive'] for n in ray.nodes()))\"" \
        2>/dev/null | sed -n 's/.*ALIVE_NODES \([0-9]*\).*/\1/p' | tail -n 1
}

# What the head's autoscaler says of each worker (its local-provider state file), by plain ssh: cheap to poll.
worker_states() {
    in_ns ctl ssh -q -i "$STATE/id_ed25519" -o BatchMode=yes -o StrictHostKeyChecking=no \
        -o UserKnownHostsFile=/dev/null "root@$(node_ip head)" cat /tmp/ray/cluster-ldpfed.state 2>/dev/null |
        "$PYTHON" -c 'import json, sys
state = json.load(sys.stdin)
tags = {ip: node["tags"] for ip, node in state.items()}
print(" ".join(ip + "=" + tag.get("ray-node-status", "?") for ip, tag in sorted(tags.items())
               if tag.get("ray-node-type") == "worker"))' 2>/dev/null || true
}

wait_for_nodes() {   # the head's autoscaler starts the workers over SSH after `ray up` returns
    local want="$1" have="" states=""
    local deadline=$(( $(date +%s) + TIMEOUT ))
    while [ "$(date +%s)" -lt "$deadline" ]; do
        states="$(worker_states)"
        if [ "$(echo "$states" | grep -o "=up-to-date" | wc -l)" -ge $(( want - 1 )) ]; then
            have="$(alive_nodes || true)"
            log "workers: $states; nodes alive (ray.nodes()): ${have:-?} of $want"
            [ "${have:-0}" -ge "$want" ] && return 0
        else
            log "workers: ${states:-?} (the head's autoscaler sets them up over SSH)"
        fi
        sleep 15
    done
    in_ns ctl "$RAY" exec "$STATE/ray_config.yaml" "tail -n 30 /tmp/ray/session_latest/logs/monitor.*" >&2 || true
    die "only ${have:-0} of $want nodes joined within ${TIMEOUT} s"
}

test_cluster() {
    [ -f "$STATE/ray_config.yaml" ] || die "no cluster: run \`$0 up\` first"
    log "ray dashboard: SSH tunnel from ctl's 127.0.0.1:8265 to the head's"
    in_ns ctl "$RAY" dashboard "$STATE/ray_config.yaml" > "$STATE/dashboard.log" 2>&1 &
    echo "tunnel ctl $!" >> "$STATE/pids"
    log "ray job submit --working-dir . -- python cluster/placement_job.py (log: $STATE/job.log)"
    local ok=""
    for _ in $(seq 1 30); do     # the tunnel takes a moment
        if in_ns ctl env RAY_ADDRESS=http://127.0.0.1:8265 RAY_AUTH_MODE=token "$RAY" job list >/dev/null 2>&1; then
            ok=1; break
        fi
        sleep 2
    done
    [ -n "$ok" ] || die "the jobs API is not reachable through the tunnel; see $STATE/dashboard.log"
    # without the token, the same request is refused
    if in_ns ctl env RAY_ADDRESS=http://127.0.0.1:8265 RAY_AUTH_MODE=token RAY_AUTH_TOKEN=wrong "$RAY" job list \
            >/dev/null 2>&1; then
        die "the jobs API accepted a wrong token"
    fi
    if ! in_ns ctl env RAY_ADDRESS=http://127.0.0.1:8265 RAY_AUTH_MODE=token timeout "$TIMEOUT" \
            "$RAY" job submit --working-dir . -- python cluster/placement_job.py $JOB_ARGS > "$STATE/job.log" 2>&1; then
        tail -n 40 "$STATE/job.log" >&2
        die "the job failed; see $STATE/job.log"
    fi
    grep '^PLACEMENT ' "$STATE/job.log" | tail -n 1
    log "job succeeded: populations and shards on every node, every round over the direct transport's sockets"
}

kill_recorded() {   # the wrappers of every namespace's first process: their deaths end everything inside
    [ -f "$STATE/pids" ] || return 0
    local pids
    pids="$(awk '{print $3}' "$STATE/pids")"
    for pid in $pids; do kill -TERM "$pid" 2>/dev/null || true; done
    for _ in $(seq 1 50); do
        local left=""
        for pid in $pids; do kill -0 "$pid" 2>/dev/null && left=1; done
        [ -z "$left" ] && return 0
        sleep 0.2
    done
    for pid in $pids; do kill -KILL "$pid" 2>/dev/null || true; done
}

down() {
    [ "$(id -u)" = 0 ] || die "needs root"
    [ -d "$STATE" ] || { log "nothing to tear down ($STATE does not exist)"; return 0; }
    if [ -f "$STATE/ray_config.yaml" ] && [ -n "$RAY" ]; then
        log "ray down"
        in_ns ctl timeout 300 "$RAY" down -y "$STATE/ray_config.yaml" > "$STATE/ray_down.log" 2>&1 \
            || log "ray down failed (see the log); removing the namespaces anyway"
    fi
    log "stopping sshd and everything left in the nodes (their PID namespaces)"
    kill_recorded
    if [ -f "$STATE/created" ]; then
        tac "$STATE/created" | while read -r kind name; do
            [ "$kind" = netns ] && { ip netns pids "$name" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true;
                                     ip netns del "$name" 2>/dev/null || true; }
        done
    fi
    if [ "${KEEP_LOGS:-0}" = 1 ]; then
        rm -rf "$STATE.logs" && mkdir -m 700 "$STATE.logs"
        cp "$STATE"/*.log "$STATE.logs/" 2>/dev/null || true
        for name in ctl $(nodes); do
            cp -r "$STATE/$name/tmp/ray/session_latest/logs" "$STATE.logs/$name-ray-logs" 2>/dev/null || true
        done
        log "logs kept in $STATE.logs"
    fi
    rm -rf "$STATE"
    local left
    left="$(ip netns list | grep -c "^$NS" || true)"
    [ "$left" = 0 ] || die "$left namespaces named $NS* are left"
    log "down: namespaces, bridge, sshd and Ray processes removed"
}

case "${1:-}" in
    up) trap 'status=$?; [ $status = 0 ] || { log "up failed: cleaning up"; down; }' EXIT; up ;;
    test) test_cluster ;;
    down) down ;;
    all) trap 'status=$?; down; exit $status' EXIT; up; test_cluster ;;
    *) echo "usage: $0 up|test|down|all" >&2; exit 2 ;;
esac

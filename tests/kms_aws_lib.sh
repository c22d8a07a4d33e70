# tests/kms_aws_lib.sh -- moto_server for the AWS KMS tests (sourced after
# tests/cli_lib.sh, which sets T, ok, bad and cli_finish).
#
# kms_aws_start NAME: check that moto_server and boto3 are installed (the
# tests fail, they do not skip, without them), start moto_server on
# 127.0.0.1 on a free port (MOTO its pid, killed on exit), and set the
# environment the client reads: test credentials, region us-east-1,
# AWS_ENDPOINT_URL_KMS the emulator, HOME under $T.  It returns non-zero
# (after cli_finish NAME) when any of that fails.
# boto PYTHON: run a snippet with k, a boto3 KMS client of the emulator.
# free_port: print a free TCP port of 127.0.0.1.

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

kms_aws_start() {
    if ! command -v moto_server >/dev/null || ! python3 -c 'import boto3' 2>/dev/null; then
        bad "moto_server and boto3 are installed (the test needs the AWS emulator)"
        cli_finish "$1"
        return 1
    fi
    PORT=$(free_port)
    (cd "$T" && exec moto_server -H 127.0.0.1 -p "$PORT" >"$T/moto.log" 2>&1) &
    MOTO=$!
    trap 'kill "$MOTO" 2>/dev/null; wait "$MOTO" 2>/dev/null; rm -rf "$T"' EXIT
    local up=0
    for _ in $(seq 1 100); do
        if curl -s -o /dev/null "http://127.0.0.1:$PORT/moto-api/"; then up=1; break; fi
        kill -0 "$MOTO" 2>/dev/null || break
        sleep 0.1
    done
    if [ "$up" -ne 1 ]; then
        bad "moto_server answers on port $PORT" "$(tail -5 "$T/moto.log")"
        cli_finish "$1"
        return 1
    fi
    ok "moto_server answers on port $PORT"
    unset AWS_PROFILE AWS_SESSION_TOKEN AWS_ENDPOINT_URL AWS_DEFAULT_REGION AWS_CONFIG_FILE AWS_SHARED_CREDENTIALS_FILE
    export AWS_ACCESS_KEY_ID=AKIDKEYSHIFTTEST AWS_SECRET_ACCESS_KEY=keyshift-test-secret AWS_REGION=us-east-1
    export AWS_ENDPOINT_URL_KMS="http://127.0.0.1:$PORT"
    export HOME="$T/home"
    mkdir -p "$HOME"
}

boto() {
    python3 -c "import boto3, sys
k = boto3.client('kms', endpoint_url='$AWS_ENDPOINT_URL_KMS', region_name='us-east-1',
                 aws_access_key_id='x', aws_secret_access_key='y')
$1"
}

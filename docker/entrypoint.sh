#!/bin/sh
# pdplane container entrypoint: settings that hold credentials may come from files
# (Docker secrets); then the command replaces this shell (exec), so it gets the signals.
#
# pdplane itself reads SECRET_KEY_FILE and METRICS_TOKEN_FILE; DATABASE_URL and REDIS_URL
# carry passwords too, so their *_FILE variants are resolved here.
set -eu

for name in DATABASE_URL REDIS_URL; do
    file_var="${name}_FILE"
    eval "file=\${$file_var:-}"
    if [ -n "$file" ]; then
        eval "direct=\${$name:-}"
        if [ -n "$direct" ]; then
            echo "pdplane: $name and $file_var are both set; set only one" >&2
            exit 2
        fi
        if [ ! -r "$file" ]; then
            echo "pdplane: $file_var=$file cannot be read" >&2
            exit 2
        fi
        value=$(cat "$file")
        export "$name=$value"
        unset "$file_var"
    fi
done

# prometheus_client's multiprocess files must not outlive the processes that wrote them:
# a restarted container keeps its /tmp, so start from an empty directory.
if [ -n "${PROMETHEUS_MULTIPROC_DIR:-}" ]; then
    mkdir -p "$PROMETHEUS_MULTIPROC_DIR"
    find "$PROMETHEUS_MULTIPROC_DIR" -mindepth 1 -maxdepth 1 -name '*.db' -delete
fi

exec "$@"

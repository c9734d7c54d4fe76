#!/bin/sh
# Create the secret files docker/compose.yaml reads (only the missing ones; never
# overwrites). Replace any of them with your own before the first `up` if you prefer.
#
#   docker/make-secrets.sh [DIR]      (default: docker/secrets next to this script)
#
# The directory is 0700 and owned by you: it is what keeps the secrets private on the
# host. The files are 0644 because Compose bind-mounts them into containers that run as
# other users (pdplane uid 10001, postgres, prometheus' nobody), which must read them.
set -eu

dir=${1:-$(dirname "$0")/secrets}
mkdir -p "$dir"
chmod 0700 "$dir"

random() {  # $1 characters from [A-Za-z0-9]
    LC_ALL=C tr -dc 'A-Za-z0-9' </dev/urandom | head -c "$1"
}

put() {  # put NAME VALUE: write the file unless it exists
    if [ -s "$dir/$1" ]; then
        echo "kept     $dir/$1"
    else
        printf '%s\n' "$2" >"$dir/$1"
        chmod 0644 "$dir/$1"
        echo "created  $dir/$1"
    fi
}

put postgres_password "$(random 32)"
# The database URL carries the password: it must match postgres_password.
put database_url "postgres://pdplane:$(cat "$dir/postgres_password")@postgres:5432/pdplane"
put secret_key "$(random 64)"
put metrics_token "$(random 40)"
put gateway_secret "$(random 43)"
put admin_password "$(random 16)"

#!/usr/bin/env bash
# The test command (`make test`): lint, migration drift, then the whole suite against
# PostgreSQL and a real Redis. Override DATABASE_URL / REDIS_URL to point elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/pdplane}
export REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379/0}
export PATH="$PWD/$VENV/bin:$PATH"

echo "== ruff"
ruff check .
echo "== migration drift"
python manage.py makemigrations --check --dry-run
echo "== pytest ($DATABASE_URL, $REDIS_URL)"
set +e
python -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: treating as failure"
  exit 1
fi
exit "$rc"

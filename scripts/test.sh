#!/usr/bin/env bash
# The test command (`make test`): services for this run, ruff, migration drift, then the
# whole suite against PostgreSQL and a real Redis (scripts/testrun.py says how they are
# chosen; DATABASE_URL / REDIS_URL override). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export PATH="$PWD/$VENV/bin:$PATH"
exec "$VENV/bin/python" scripts/testrun.py "$@"

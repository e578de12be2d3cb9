#!/usr/bin/env bash
# What `make scale-up` needs beyond `make setup`: the OS packages of the local scale profile.
# PostgreSQL's server binaries (initdb, pg_ctl, postgres) and Redis (the celery broker) come from the OS; as root
# with apt this installs what is missing, elsewhere it says what to install. RVU_SCALE_CELERY_WORKERS=0 needs no Redis.
set -euo pipefail
missing=()
command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
if [ "${RVU_SCALE_CELERY_WORKERS:-2}" != "0" ]; then
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
fi
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "scale-setup: installing ${missing[*]} (apt)"
  apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null || { apt-get update >/dev/null && \
    apt-get install -y --no-install-recommends "${missing[@]}" >/dev/null; }
else
  echo "scale-setup: missing OS packages: ${missing[*]}; install them (Debian: sudo apt install ${missing[*]})," \
       "or set RVU_SCALE_CELERY_WORKERS=0 to do without Redis" >&2
  exit 1
fi

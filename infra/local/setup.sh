#!/usr/bin/env bash
# Make this machine ready to run Castad: Python environment from the lock file,
# PostgreSQL and RabbitMQ reachable, a Hangul font for video captions, eSpeak NG for the
# singing voice, Debian's chromium
# for the console's browser test and tesseract-ocr for the video's legibility test, then every service database
# created and migrated and
# the RabbitMQ topology declared.
# Idempotent: a second run only checks. Installs Debian packages only as root.
set -euo pipefail
cd "$(dirname "$0")/../.."

PG_HOST=127.0.0.1 PG_PORT=5432 AMQP_PORT=5672
say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
die() { printf '\033[31m[setup] %s\033[0m\n' "$*" >&2; exit 1; }
is_root() { [ "$(id -u)" = 0 ]; }
port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }
apt_install() {
  is_root || return 1
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q "$@" >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q "$@" >/dev/null; }
}
wait_port() {
  for _ in $(seq 1 60); do port_open "$1" "$2" && return 0; sleep 1; done
  return 1
}

# 1. Python 3.11, uv (the version pyproject.toml requires) and .venv synced from uv.lock.
PYTHON=""
for candidate in python3.11 python3; do
  if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys, venv; assert sys.version_info[:2] == (3, 11)' 2>/dev/null; then
    PYTHON=$(command -v "$candidate"); break
  fi
done
if [ -z "$PYTHON" ]; then
  apt_install python3 python3-venv && PYTHON=$(command -v python3) \
    || die "Python 3.11 with venv is needed: apt-get install python3 python3-venv (Debian 12), then rerun."
fi
UV_VERSION=$(sed -n 's/^required-version = "==\(.*\)"$/\1/p' pyproject.toml)
UV=var/tools/uv-$UV_VERSION/bin/uv
if [ ! -x "$UV" ]; then
  say "installing uv $UV_VERSION into var/tools"
  "$PYTHON" -m venv "var/tools/uv-$UV_VERSION"
  "var/tools/uv-$UV_VERSION/bin/pip" install -q "uv==$UV_VERSION"
fi
# Every workspace package editable, every other dependency at its locked version; a no-op when in sync. Compiled to
# bytecode as it is installed: where PYTHONDONTWRITEBYTECODE is set (as in many CI images), every process would
# otherwise compile each dependency's module it imports again, about 1.5 s of CPU for each service, worker or
# command started (the workspace's own modules, installed editable, still are: about 0.2 s).
UV_PYTHON_DOWNLOADS=never "$UV" sync --frozen --all-packages --python "$PYTHON" --quiet --compile-bytecode

# 2. PostgreSQL on 127.0.0.1:5432, user postgres without a password.
if ! port_open $PG_HOST $PG_PORT; then
  if is_root; then
    say "PostgreSQL not running: installing and starting Debian's postgresql"
    apt_install postgresql || die "could not install postgresql"
    version=$(ls /etc/postgresql | sort -V | tail -1)
    hba=/etc/postgresql/$version/main/pg_hba.conf
    if ! grep -q "castad: local trust" "$hba"; then
      # Local development only: trust connections from this machine.
      sed -i "1i host all postgres 127.0.0.1/32 trust # castad: local trust" "$hba"
    fi
    pg_ctlcluster --skip-systemctl-redirect "$version" main start || pg_ctlcluster "$version" main reload
    wait_port $PG_HOST $PG_PORT || die "PostgreSQL did not start; see /var/log/postgresql"
  else
    die "PostgreSQL is not reachable on $PG_HOST:$PG_PORT. As root run: apt-get install postgresql,
then allow 'host all postgres 127.0.0.1/32 trust' in pg_hba.conf and start it
(pg_ctlcluster <version> main start); or point CASTAD_*_DATABASE_URL at your server."
  fi
fi

# 2b. The tests' own PostgreSQL server on 127.0.0.1:5433 (CASTAD_TEST_PG_URL names another), made from Debian's
#     postgresql and run without fsync: the tests make and drop hundreds of databases, and a crash of this server
#     loses nothing anyone needs. Durability itself is proven by the fault suite, on servers of its own.
TEST_PG_PORT=5433 TEST_PG_CLUSTER=castad-tests
TEST_PG_CONF="# castad: the tests' server (infra/local/setup.sh)
listen_addresses = '127.0.0.1'
port = $TEST_PG_PORT
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 400
autovacuum = off"
pg_programs() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }
if [ -z "${CASTAD_TEST_PG_URL:-}" ] && ! port_open $PG_HOST $TEST_PG_PORT; then
  say "starting the tests' PostgreSQL server on $PG_HOST:$TEST_PG_PORT (no fsync)"
  [ -n "$(pg_programs)" ] || apt_install postgresql \
    || die "The tests' PostgreSQL server needs Debian's postgresql: as root run apt-get install postgresql, then rerun;
or set CASTAD_TEST_PG_URL to a server of yours (a superuser's URL without a database)."
  if is_root; then
    version=$(basename "$(dirname "$(pg_programs)")")
    conf=/etc/postgresql/$version/$TEST_PG_CLUSTER
    if [ ! -d "$conf" ]; then
      pg_createcluster -q --start-conf=manual -p $TEST_PG_PORT "$version" $TEST_PG_CLUSTER >/dev/null
      sed -i "1i host all postgres 127.0.0.1/32 trust # castad: local trust" "$conf/pg_hba.conf"
      echo "$TEST_PG_CONF" > "$conf/conf.d/castad-tests.conf"
    fi
    pg_ctlcluster --skip-systemctl-redirect "$version" $TEST_PG_CLUSTER start
  else
    data=var/test-postgres
    if [ ! -f $data/PG_VERSION ]; then
      "$(pg_programs)/initdb" -D $data -U postgres --auth-local=trust --auth-host=scram-sha-256 >/dev/null
      sed -i "1i host all postgres 127.0.0.1/32 trust # castad: local trust" $data/pg_hba.conf
      printf '%s\nunix_socket_directories = '"'%s'"'\n' "$TEST_PG_CONF" "$PWD/$data" >> $data/postgresql.conf
    fi
    "$(pg_programs)/pg_ctl" -D $data -l $data/server.log -w start >/dev/null
  fi
  wait_port $PG_HOST $TEST_PG_PORT || die "the tests' PostgreSQL server did not start; see its log"
fi

# 3. RabbitMQ on 127.0.0.1:5672 (guest/guest works from localhost).
if ! port_open $PG_HOST $AMQP_PORT; then
  if is_root; then
    say "RabbitMQ not running: installing and starting Debian's rabbitmq-server"
    apt_install rabbitmq-server || die "could not install rabbitmq-server"
    rabbitmq-server -detached || true
    wait_port $PG_HOST $AMQP_PORT || die "RabbitMQ did not start; see /var/log/rabbitmq"
  else
    die "RabbitMQ is not reachable on $PG_HOST:$AMQP_PORT. As root run: apt-get install rabbitmq-server
and start it (rabbitmq-server -detached); or point CASTAD_AMQP_URL at your broker."
  fi
fi

# 3b. The programs of the clustered engines the fault harness and its tests start beside the servers above
#     (libs/faults/castad_faults/engines.py): Debian's rabbitmq-server and postgresql, even where the servers above are
#     someone else's, and libfaketime, which runs a standby's clock ahead.
if is_root && { [ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || ! ls /usr/lib/postgresql/*/bin/pg_basebackup >/dev/null 2>&1 \
    || ! ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1; }; then
  say "installing Debian's rabbitmq-server, postgresql and libfaketime for the clustered engines of the fault tests"
  apt_install rabbitmq-server postgresql libfaketime || die "could not install rabbitmq-server, postgresql and libfaketime"
fi

# 4. Caption fonts for every language a brief may have: Korean and English (fonts-nanum),
#    Japanese and Chinese (fonts-noto-cjk). ffmpeg itself comes from imageio-ffmpeg.
fonts_found() {
  .venv/bin/python -c 'from castad_contracts import brief; from castad_video import fonts
for language in brief.Language: fonts.find_font(language)' 2>/dev/null
}
if ! fonts_found; then
  if is_root; then
    say "installing Debian's fonts-nanum and fonts-noto-cjk for the captions"
    apt_install fonts-nanum fonts-noto-cjk || die "could not install fonts-nanum and fonts-noto-cjk"
  else
    die "Caption fonts are missing. As root run: apt-get install fonts-nanum fonts-noto-cjk, or set CASTAD_VIDEO_FONT_PATH."
  fi
fi

# 5. Debian's espeak-ng, whose library speaks the lyrics the song's voice sings (castad_song.voice).
if ! .venv/bin/python -c 'from castad_song import espeak, voice; assert not espeak.missing_voices([f"{c}+f3" for c in voice.LANGUAGES.values()])' 2>/dev/null; then
  if is_root; then
    say "installing Debian's espeak-ng for the singing voice"
    apt_install espeak-ng || die "could not install espeak-ng"
  else
    die "The singing voice needs eSpeak NG. As root run: apt-get install espeak-ng, or set CASTAD_SONG_VOICE=off."
  fi
fi

# 6. Debian's chromium, which the console's browser test drives with playwright (no browser is downloaded).
#    Only the tests need it: without root, say what to run and go on.
if [ ! -x /usr/bin/chromium ]; then
  if is_root; then
    say "installing Debian's chromium for the console's browser test"
    apt_install chromium || die "could not install chromium"
  else
    say "Debian's chromium is missing (the console's browser test needs it). As root run: apt-get install chromium"
  fi
fi

# 7. Debian's tesseract-ocr, with which the video's tests read the business's name back from its frames. Only the
#    tests need it: without root, say what to run and go on.
if ! command -v tesseract >/dev/null; then
  if is_root; then
    say "installing Debian's tesseract-ocr for the video's legibility test"
    apt_install tesseract-ocr || die "could not install tesseract-ocr"
  else
    say "Debian's tesseract-ocr is missing (the video's legibility test needs it). As root run: apt-get install tesseract-ocr"
  fi
fi

# 8. Databases, migrations, exchange, queues and bindings.
.venv/bin/castad-admin setup

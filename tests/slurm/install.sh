#!/usr/bin/env bash
# install.sh - install what tests/slurm/local_slurm.sh needs: Debian's slurm-wlm daemons
# (slurmctld, slurmd), the client commands and munge; with WITH_DBD=1 also slurmdbd + MariaDB
# so that `sacct` works.
#
# Meant for CI (Debian 12, root, `.ci/run`). It never fails the build: when it cannot install
# (not root, no apt-get, no network, no package), it says why and exits 0, and
# tests/integration/test_slurm.py then skips with that reason.
#
# Usage:  bash tests/slurm/install.sh            (WITH_DBD=1 to add slurmdbd + mariadb-server)
set -uo pipefail

say() { echo "[tests/slurm/install.sh] $*"; }

PKGS=(slurmctld slurmd slurm-client munge)
[ "${WITH_DBD:-0}" = 1 ] && PKGS+=(slurmdbd mariadb-server)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -eq 0 ]; then
  say "already installed: ${PKGS[*]}"
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  say "not root: cannot install ${missing[*]}; the SLURM tests will be skipped"
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  say "no apt-get (not Debian/Ubuntu): cannot install ${missing[*]}; the SLURM tests will be skipped"
  exit 0
fi

t0=$(date +%s)
say "installing ${missing[*]}"
# Without systemd as PID 1 the packages' postinst cannot start the services; that is expected
# (the fixture starts the daemons itself). policy-rc.d 101 keeps postinst from even trying.
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made_policy=1
fi
ok=1
if ! apt-get update -qq >/tmp/slurm-install.log 2>&1; then
  ok=0
elif ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  "${missing[@]}" >>/tmp/slurm-install.log 2>&1; then
  ok=0
fi
[ "$made_policy" = 1 ] && rm -f "$policy"
if [ "$ok" = 0 ]; then
  say "apt-get failed (see /tmp/slurm-install.log; last lines below); the SLURM tests will be skipped"
  tail -n 5 /tmp/slurm-install.log | sed 's/^/    /'
  exit 0
fi
say "installed in $(( $(date +%s) - t0 )) s: $(dpkg-query -W -f='${Package} ${Version}\n' slurmctld munge | tr '\n' ' ')"

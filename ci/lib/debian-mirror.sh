#!/usr/bin/env bash
# Prints the Debian mirror the tests, benchmarks and e2e take Debian
# packages from (an http(s) URL ending in /debian):
#   * KUBESLOT_DEBIAN_MIRROR when it is set (a machine whose apt sources
#     name no Debian archive: GitHub's Ubuntu runner, .github/workflows/ci.yml);
#   * else the first such URL in this machine's apt sources (deb822
#     `URIs:` and one-line `deb` entries; the security archive is not one).
# Never a host name written in the repository: either the caller says it
# or the machine's own apt configuration does. Fails naming the variable
# when neither has one.
set -euo pipefail
if [ -n "${KUBESLOT_DEBIAN_MIRROR:-}" ]; then
  printf '%s\n' "${KUBESLOT_DEBIAN_MIRROR%/}"
  exit 0
fi
mirror=$(
  { cat /etc/apt/sources.list.d/*.sources 2>/dev/null | sed -n 's/^URIs:[[:space:]]*//p' | tr ' ' '\n'
    cat /etc/apt/sources.list.d/*.list /etc/apt/sources.list 2>/dev/null |
      sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\(http[^[:space:]]*\).*/\2/p'
  } | grep -v security | grep -E '^https?://.*/debian/?$' | head -n1 || true
)
[ -n "$mirror" ] || {
  echo "debian-mirror: no Debian archive in /etc/apt/sources.list(.d) (not a Debian machine?): set KUBESLOT_DEBIAN_MIRROR to a Debian mirror's URL (…/debian)" >&2
  exit 1
}
printf '%s\n' "${mirror%/}"

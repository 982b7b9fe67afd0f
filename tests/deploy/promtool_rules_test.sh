#!/usr/bin/env bash
# The alert rules under deploy/prometheus checked with Prometheus's promtool:
#   promtool_rules_test.sh check              promtool check rules (syntax, lint)
#   promtool_rules_test.sh test FILE.yaml     promtool test rules FILE (one alert's unit test)
#   promtool_rules_test.sh coverage           every alert has a unit test that expects it to
#                                             fire and one that expects it not to
# Exits 77 (ctest: skipped) with the reason when promtool is not installed.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
rules="$root/deploy/prometheus/wsync-rules.yaml"
tests_dir="$root/deploy/prometheus/tests"
promtool=${PROMTOOL:-$(command -v promtool || true)}
if [ -z "$promtool" ]; then
  echo "SKIPPED: promtool not found (Debian package 'prometheus', see scripts/install_deps.sh)"
  exit 77
fi
case "${1:-}" in
  check)
    "$promtool" check rules --lint=all --lint-fatal "$rules"
    ;;
  test)
    cd "$tests_dir"
    "$promtool" test rules "$2"
    ;;
  coverage)
    status=0
    alerts=$(sed -n 's/^ *- alert: *\([A-Za-z0-9_]*\).*/\1/p' "$rules")
    [ -n "$alerts" ] || { echo "no alerts found in $rules"; exit 1; }
    for a in $alerts; do
      # The line after "alertname: A" tells an expected-silent case
      # ("exp_alerts: []") from an expected-firing one ("exp_alerts:").
      after=$(grep -h -A1 -E "alertname: *$a *\$" "$tests_dir"/*.yaml | grep -E 'exp_alerts:' || true)
      if ! grep -q 'exp_alerts: *\[\]' <<<"$after"; then
        echo "alert $a: no unit test in $tests_dir expects it NOT to fire"; status=1
      fi
      if ! grep -q -E 'exp_alerts: *$' <<<"$after"; then
        echo "alert $a: no unit test in $tests_dir expects it to fire"; status=1
      fi
    done
    [ $status -eq 0 ] && echo "every alert ($(echo $alerts | wc -w)) fires and stays silent in a unit test"
    exit $status
    ;;
  *)
    echo "usage: $0 check | test FILE.yaml | coverage" >&2
    exit 2
    ;;
esac

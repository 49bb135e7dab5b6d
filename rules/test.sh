#!/usr/bin/env bash
# promtool check + unit tests for every rules file (run by `make rules-test`, part of `make test`).
set -euo pipefail
cd "$(dirname "$0")"
shopt -s nullglob
rule_files=(*.rules.yaml)
test_files=(tests/*.test.yaml)
if [ ${#rule_files[@]} -eq 0 ] || [ ${#test_files[@]} -eq 0 ]; then
  echo "rules/test.sh: no rules or no rule tests found" >&2
  exit 1
fi
promtool check rules "${rule_files[@]}"
promtool test rules "${test_files[@]}"

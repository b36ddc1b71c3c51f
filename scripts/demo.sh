#!/usr/bin/env bash
# The main job. Until the GPT training program exists: build, print the environment
# report and resolve the demo config with dscpp_report.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh cpu
./build/tools/dscpp_report
./build/tools/dscpp_report --config ds_configs/ds_config_small.json --world-size 2

#!/bin/bash
# The name the RULER runs' READMEs give the shard runner: scripts/task_shards.sh runs any task step.
exec "$(dirname "$0")/task_shards.sh" "$@"

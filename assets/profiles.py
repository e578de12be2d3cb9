"""What an asset says about where it runs: the default job (`make run`) takes every asset of the code location
except those tagged here, so a new full study declares itself instead of joining a central list."""

PROFILE_TAG = "rvu/profile"
FULL_STUDY = {PROFILE_TAG: "full"}  # hours of CPU, or a partitioned cell: its own job, backfills and the UI
NIGHTLY_ONLY = {PROFILE_TAG: "nightly"}  # minutes of inference the nightly sweep runs, not `make run`

"""Helpers shared by the test files, one home each: polling (:mod:`.polling`), the
Prefect API as the tests read it (:mod:`.prefect_api`), a page as Chromium renders it
(:mod:`.browser`), the test tiers (:mod:`.tiers`) and the per-file timings (:mod:`.timings`)."""

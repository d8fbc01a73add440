"""Create the ``popflow-notify-new-best`` automation (``notify_new_best.yaml``) on the
Prefect server ``PREFECT_API_URL`` names, with a Webhook block that calls ``URL``:

    python examples/automations/notify_new_best.py https://hooks.example.com/popflow

Run it again to change the URL: the block is overwritten and the automation made anew.
Then every popflow run that reports to that server calls the webhook on a new best
trial (a JSON POST: experiment, metric, value, trial, round, config, checkpoint).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path
from uuid import UUID

import yaml

logger = logging.getLogger("notify_new_best")

HERE = Path(__file__).resolve().parent
#: the automation, with ``WEBHOOK_BLOCK_ID`` where the block's id goes
AUTOMATION = HERE / "notify_new_best.yaml"
#: the Webhook block the automation calls
BLOCK = "popflow-new-best"


def automation_data(block_id: UUID) -> dict:
    """The automation of ``notify_new_best.yaml``, calling the block ``block_id``."""
    text = AUTOMATION.read_text().replace("WEBHOOK_BLOCK_ID", str(block_id))
    (automation,) = yaml.safe_load(text)["automations"]
    return automation


async def create(url: str) -> UUID:
    """Save the Webhook block (to ``url``) and create the automation; its id."""
    from prefect.blocks.webhook import Webhook
    from prefect.client.orchestration import get_client
    from prefect.events.schemas.automations import AutomationCore

    # a local receiver (127.0.0.1) is allowed: the block's default
    block_id = await Webhook(method="POST", url=url).asave(BLOCK, overwrite=True)
    automation = AutomationCore.model_validate(automation_data(block_id))
    async with get_client() as client:
        for old in await client.read_automations_by_name(automation.name):
            await client.delete_automation(old.id)
        return await client.create_automation(automation)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", help="the webhook's URL (it receives a JSON POST)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    automation_id = asyncio.run(create(args.url))
    logger.info("automation popflow-notify-new-best: %s (webhook block %s)", automation_id, BLOCK)


if __name__ == "__main__":
    main()

"""Copy this: an Azure Functions queue trigger that reads what delayed delivery put on a Storage Queue.

Put it in your own function app's ``function_app.py`` (azure-functions and ``delayed-delivery[azure]`` in its
requirements). Set ``ORDERS_QUEUE`` to the queue name and ``DelayedDeliveryQueues__queueServiceUri`` (managed
identity, with Storage Queue Data Reader and Message Processor on the queue) or ``DelayedDeliveryQueues`` (a
connection string). In host.json, ``extensions.queues.messageEncoding`` must be ``"none"``: the envelope is JSON
text, not base64. The dispatcher's own app registers the same consumer when ``deployExampleConsumer`` is on.
"""

from __future__ import annotations

import azure.functions as func

from delayed_delivery.azure.receive import delivered_from_queue_message, observe_lateness

app = func.FunctionApp()


@app.queue_trigger(arg_name="msg", queue_name="%ORDERS_QUEUE%", connection="DelayedDeliveryQueues")
def consume_orders(msg: func.QueueMessage) -> None:
    """One delivered message: its id, body and headers, and one log line with its lateness."""
    delivered = delivered_from_queue_message(msg)
    observe_lateness(delivered)
    # Your work here, with delivered.message_id, delivered.body (bytes) and delivered.headers. Raising makes the
    # host retry the message (five tries, then the <queue>-poison queue): delivery is at least once.

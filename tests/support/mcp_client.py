"""An MCP client for the tests of `wma mcp`, on the MCP Python SDK.

It connects over stdio (it starts the server itself) or streamable HTTP,
lists the tools, makes the calls of a plan and prints what it saw as one
JSON object on stdout:

    {"server": {...}, "tools": [...], "calls": [...]}

The plan is a JSON object on argv[1]:

    {"stdio": {"command": "...", "args": [...]}}          # or
    {"http": {"url": "http://.../mcp", "token": "..."}}   # token optional
    "calls": [{"tool": "...", "arguments": {...},
               "cancel_after": 0.5}]                     # cancel_after optional
    "elicit": {"approve": true}                           # optional

A call with `cancel_after` is cancelled that many seconds after it was
sent, with the protocol's `notifications/cancelled`; its entry then says
`{"cancelled": true}`. A call with `drop_after` is given up that many
seconds after it was sent, and the client goes away (it closes its
connections, or the server's stdin): its entry says `{"dropped": true}`
and it must be the last. Every other call's entry is the tool's result as
the SDK parsed it: `isError` and the text of each content block, with
the messages of the progress notifications the server sent for it.

With `elicit`, the client offers form elicitation and answers every
question the server asks with that content (accepting it); the questions
are reported under "elicited", each with its message and schema. Without
it the client offers no elicitation.
"""

import json
import sys
from datetime import timedelta

import anyio
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client

# No call of a test takes this long; a hang fails instead of blocking.
CALL_LIMIT = timedelta(seconds=60)


async def cancelled_call(session, tool, arguments, after):
    """Sends the call, then cancels it `after` seconds later."""
    # The session numbers its requests in order: this call takes the next.
    request_id = session._request_id
    result = {}

    async def call():
        try:
            await session.call_tool(tool, arguments)
            result["answered"] = True
        except Exception as error:  # the server does not answer a cancelled call
            result["error"] = str(error)

    async with anyio.create_task_group() as group:
        group.start_soon(call)
        await anyio.sleep(after)
        await session.send_notification(
            types.ClientNotification(
                types.CancelledNotification(
                    params=types.CancelledNotificationParams(
                        requestId=request_id, reason="the test cancels it"
                    )
                )
            )
        )
        # The server sends nothing for a cancelled request: stop waiting.
        await anyio.sleep(0.5)
        group.cancel_scope.cancel()
    return {"cancelled": True, **result}


def elicitation(plan, report):
    """The session's elicitation callback for `plan`, or None."""
    if "elicit" not in plan:
        return None

    async def answer(context, params):
        report["elicited"].append(
            {"message": params.message, "schema": params.requestedSchema}
        )
        return types.ElicitResult(action="accept", content=plan["elicit"])

    return answer


async def session_plan(session, plan, report):
    init = await session.initialize()
    listed = await session.list_tools()
    report["server"] = init.serverInfo.model_dump(mode="json", exclude_none=True)
    report["tools"] = [t.model_dump(mode="json", exclude_none=True) for t in listed.tools]
    for step in plan.get("calls", []):
        tool, arguments = step["tool"], step.get("arguments", {})
        if "drop_after" in step:
            with anyio.move_on_after(step["drop_after"]):
                await session.call_tool(tool, arguments)
                raise RuntimeError(f"the call of {tool} answered before it was dropped")
            report["calls"].append({"dropped": True})
            break
        if "cancel_after" in step:
            report["calls"].append(
                await cancelled_call(session, tool, arguments, step["cancel_after"])
            )
            continue
        progress = []

        async def told(done, total, message):
            progress.append(message)

        result = await session.call_tool(tool, arguments, progress_callback=told)
        report["calls"].append(
            {
                "isError": bool(result.isError),
                "texts": [c.text for c in result.content if c.type == "text"],
                "progress": progress,
            }
        )
    return report


async def main(plan):
    report = {"calls": [], "elicited": []}
    callback = elicitation(plan, report)
    if "stdio" in plan:
        server = StdioServerParameters(
            command=plan["stdio"]["command"],
            args=plan["stdio"].get("args", []),
            env=plan["stdio"].get("env"),
        )
        async with stdio_client(server, errlog=sys.stderr) as (read, write):
            async with ClientSession(
                read, write, read_timeout_seconds=CALL_LIMIT, elicitation_callback=callback
            ) as session:
                return await session_plan(session, plan, report)
    http = plan["http"]
    headers = {}
    if http.get("token"):
        headers["Authorization"] = f"Bearer {http['token']}"
    async with streamablehttp_client(http["url"], headers=headers) as (read, write, _):
        async with ClientSession(
            read, write, read_timeout_seconds=CALL_LIMIT, elicitation_callback=callback
        ) as session:
            return await session_plan(session, plan, report)


if __name__ == "__main__":
    report = anyio.run(main, json.loads(sys.argv[1]))
    print(json.dumps(report))

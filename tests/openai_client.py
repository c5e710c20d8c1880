"""The `openai` Python package as a client of `wma serve`'s OpenAI API.

tests/openai_api.rs runs it with the venv of tools/python/clients.txt:

    python tests/openai_client.py BASE_URL MODEL FIRST_REQUEST NEXT_REQUEST

with the server's token in WMA_TOKEN. It prints one JSON object per line,
one for each thing it did, and the test asserts on them: the models; a
completion (`stream=False`) of FIRST_REQUEST; a streamed one
(`stream=True`) of NEXT_REQUEST in the session the first one started;
an unknown model; a refused option; a wrong token.
"""

import json
import os
import sys

import openai


def say(step, **fields):
    print(json.dumps({"step": step, **fields}), flush=True)


def main():
    base_url, model, first, following = sys.argv[1:5]
    token = os.environ["WMA_TOKEN"]
    # No retries: every error must reach the test as the server sent it.
    client = openai.OpenAI(base_url=base_url, api_key=token, max_retries=0)

    say("models", ids=[m.id for m in client.models.list()])

    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "user", "content": first}],
    )
    completion = raw.parse()
    session = raw.headers.get("x-session-id")
    say(
        "plain",
        id=completion.id,
        object=completion.object,
        model=completion.model,
        content=completion.choices[0].message.content,
        role=completion.choices[0].message.role,
        finish_reason=completion.choices[0].finish_reason,
        session=session,
    )

    stream = client.chat.completions.create(
        model=model,
        messages=[
            {"role": "user", "content": first},
            {"role": "assistant", "content": completion.choices[0].message.content},
            {"role": "user", "content": following},
        ],
        stream=True,
        extra_headers={"X-Session-Id": session},
    )
    chunks = list(stream)
    say(
        "stream",
        chunks=len(chunks),
        objects=sorted({c.object for c in chunks}),
        ids=sorted({c.id for c in chunks}),
        roles=[c.choices[0].delta.role for c in chunks if c.choices[0].delta.role],
        content="".join(c.choices[0].delta.content or "" for c in chunks),
        finish_reasons=[c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason],
    )

    try:
        client.chat.completions.create(
            model="no-such-agent", messages=[{"role": "user", "content": first}]
        )
        say("missing", status=None)
    except openai.NotFoundError as e:
        say("missing", status=e.status_code, code=e.code, param=e.param)

    try:
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": first}],
            tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        )
        say("tools", status=None)
    except openai.BadRequestError as e:
        say("tools", status=e.status_code, param=e.param, message=e.message)

    stranger = openai.OpenAI(base_url=base_url, api_key="not-" + token, max_retries=0)
    try:
        stranger.models.list()
        say("stranger", status=None)
    except openai.AuthenticationError as e:
        say("stranger", status=e.status_code)


if __name__ == "__main__":
    main()

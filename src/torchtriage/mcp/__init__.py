"""`torchtriage mcp`: the offline verbs served to coding agents over the Model Context Protocol (stdio).

Each tool call runs the CLI itself (`python -m torchtriage VERB --json ...`) in a child process, so the
verdict is the CLI's by construction, every limit and refusal of the CLI holds, and a hostile file can
cost a child but never the server. The server adds three bounds of its own: paths only inside the
`--root` folders (`roots.py`), arguments built from typed tool parameters, never a shell (`commands.py`),
and a wall-clock deadline and an output cap per call (`runner.py`). Only `server.py` and `results.py`
import the `mcp` SDK, and only the `mcp` verb imports them: the CLI's start-up never pays for it.
"""

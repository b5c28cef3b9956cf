"""Size for the replayed Claude Code and Codex sessions (tests/agent_sessions.py): a system prompt padded with
agent instructions of the kind Claude Code sends (its real one, with the tool definitions, is ~3k tokens and
more), and a scripted tool loop as long as asked. The defaults of tests/agent_sessions.py use neither."""

from __future__ import annotations

# English prose in a BPE vocabulary (SmolLM2's, Llama's) runs about four characters a token: the padded
# prompt is sized by it, and bench/agents.py prints the tokens the engine then reports.
CHARS_PER_TOKEN = 4

INSTRUCTIONS = [
    "# Tone and style\n"
    "Be concise, direct and to the point. Answer in fewer than four lines unless the user asks for "
    "detail. Do not add preamble or postamble such as explaining your code or summarising your action"
    " unless asked. One word answers are best when they answer the question.",
    "# Proactiveness\n"
    "Do what the user asks, including follow-up actions that are clearly implied, but do not surprise"
    " the user with actions they did not ask for. When asked how to approach something, answer the "
    "question first and do not immediately start changing files.",
    "# Following conventions\n"
    "When you change a file, first understand its code conventions. Mimic the style, use the existing"
    " libraries and utilities, and follow the existing patterns. Never assume a library is available:"
    " check the manifest (package.json, pyproject.toml, Cargo.toml) or the neighbouring files.",
    "# Code style\n"
    "Do not add comments to the code you write unless the user asks for them or the code is complex "
    "and needs the context. Keep functions small and names clear; prefer the existing helpers over "
    "writing a second copy of the same logic.",
    "# Task management\n"
    "Use the todo tools to plan and track multi-step tasks. Mark a todo in progress before you start "
    "it and completed as soon as it is done; do not batch completions. Break large tasks into smaller"
    " steps the user can follow.",
    "# Doing tasks\n"
    "Search the codebase to understand it before you change it. Implement the solution with the tools"
    " available. Verify it with the project's tests; never assume a test framework or a test script: "
    "read the README or search the codebase to find how tests are run.",
    "# Lint and type checks\n"
    "When you have completed a task, run the lint and type-check commands the project uses (npm run "
    "lint, ruff, mypy, cargo clippy) to make sure the code is correct. If you cannot find the "
    "commands, ask the user for them and suggest writing them down for next time.",
    "# Committing\n"
    "Never commit changes unless the user explicitly asks you to. When asked, run git status, git "
    "diff and git log first, draft a message that says why rather than what, and do not push to the "
    "remote unless the user asks for it.",
    "# Tool usage policy\n"
    "When several independent pieces of information are needed, batch the tool calls together in one "
    "answer. Prefer the dedicated tools over shell commands: read files with Read rather than cat, "
    "edit them with Edit rather than sed, search with the search tools rather than grep in the shell.",
    "# Security\n"
    "Assist with defensive security tasks only. Refuse to create, modify or improve code that may be "
    "used maliciously. Never introduce code that exposes or logs secrets and keys, and never commit "
    "secrets or keys to the repository.",
    "# File references\n"
    "When referring to a specific function or piece of code, include the pattern "
    "file_path:line_number so the user can navigate to the source location easily.",
    "# Environment\n"
    "Working directory: /home/user/project. Is directory a git repo: yes. Platform: linux. The shell "
    "is bash; commands time out after two minutes unless a longer timeout is given; output longer "
    "than thirty thousand characters is truncated.",
]


def padded_system(base: str, tokens: int) -> str:
    """`base` followed by instruction sections until the text is about `tokens` long; the sections repeat,
    numbered, beyond their first round (no two sections are the same text)."""
    parts = [base]
    index = 0
    while sum(len(part) + 2 for part in parts) < tokens * CHARS_PER_TOKEN:
        section = INSTRUCTIONS[index % len(INSTRUCTIONS)]
        rounds = index // len(INSTRUCTIONS)
        parts.append(section if not rounds else section.replace("\n", f" ({rounds + 1})\n", 1))
        index += 1
    return "\n\n".join(parts)


# Beyond tests/agent_sessions.STEPS: the loop goes on reading, editing and testing one module after another.
def further_step(index: int) -> tuple[str, dict[str, str], str]:
    """The scripted (tool, input, result) of the `index`-th step past the fixed ones: a read, an edit and a
    test run in turn, each three on module `index // 3`."""
    number = index // 3
    module = f"src/calc/ops_{number}.py"
    kind = index % 3
    if kind == 0:
        body = f'def op_{number}(a, b):\n    """Apply operation {number}."""\n    return a * b - {number}\n'
        return ("Read", {"path": module}, body)
    if kind == 1:
        return ("Edit", {"path": module, "old": f"a * b - {number}", "new": f"a * b + {number}"}, "edited")
    return (
        "Bash",
        {"cmd": f"pytest -q tests/test_ops_{number}.py"},
        f"{number + 3} passed in 0.{index:02d}s",
    )

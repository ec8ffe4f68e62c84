"""The chat template the stack serves and trains with: Qwen2.5's ChatML, tool-aware, with a `developer` role and
the assistant's generated part marked for the trainer.

It renders the same text as Qwen2.5's own template for the roles that template knows (system, user, assistant with
`<tool_call>` blocks, tool replies as `<tool_response>` blocks in a user turn), so vLLM's `hermes` tool parser reads
the calls back, and adds what the stack needs:
  * `developer` turns (the stack sends TASK.md as one, CaPtain App. B) render as their own ChatML turn instead of
    being merged into the system turn or dropped;
  * an unknown role is an error, not silently dropped;
  * what the assistant generates (content, `<tool_call>` blocks, `<|im_end|>`) sits inside `{% generation %}`, so
    `apply_chat_template(..., return_assistant_tokens_mask=True)` yields the response mask SFT needs.
The tiny test model (captain_ros_training.tiny) and the real student (captain_ros_training.student) both carry it; the
served model's folder holds it as its `chat_template`, so vLLM and the trainer render requests with the same text.
"""

from __future__ import annotations

# The tool's template (Qwen2.5 ChatML, tool-aware, `developer` role, error on unknown roles) with the assistant's
# generated part marked. transformers sets trim_blocks and lstrip_blocks; every tag strips on its left, so no
# template whitespace reaches the output and newlines are emitted explicitly. The text is identical to the
# tool's: 'assistant' + '\n' + content + '\n<tool_call>...' there is 'assistant\n' + content + '\n' +
# '<tool_call>...' here, which moves the first newline out of the generated span (it belongs to the generation
# prompt '<|im_start|>assistant\n').
TOOL_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == "assistant" %}
        {{- '<|im_start|>assistant\n' }}
        {%- generation %}
            {%- if message.tool_calls %}
                {%- if message.content %}
                    {{- message.content + '\n' }}
                {%- endif %}
                {%- for tool_call in message.tool_calls %}
                    {%- if tool_call.function is defined %}
                        {%- set tool_call = tool_call.function %}
                    {%- endif %}
                    {{- '<tool_call>\n{"name": "' }}
                    {{- tool_call.name }}
                    {{- '", "arguments": ' }}
                    {%- if tool_call.arguments is string %}
                        {{- tool_call.arguments }}
                    {%- else %}
                        {{- tool_call.arguments | tojson }}
                    {%- endif %}
                    {{- '}\n</tool_call>' }}
                    {%- if not loop.last %}
                        {{- '\n' }}
                    {%- endif %}
                {%- endfor %}
            {%- else %}
                {{- message.content }}
            {%- endif %}
            {{- '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\n' }}
    {%- elif (message.role == "user") or (message.role == "developer") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- elif not (message.role == "system" and loop.first) %}
        {{- raise_exception("unsupported message role '" + message.role + "': use system, developer, user, assistant or tool") }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""  # noqa: E501 (Qwen's template layout, kept as it is)

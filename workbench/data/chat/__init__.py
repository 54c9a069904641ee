"""Conversations: chat records read, rendered through the model's template, encoded with their loss mask, drawn.

- ``chat_templates``   chat templates rendered as transformers renders them, the built-in ChatML, the
                       characters each assistant turn contributes
- ``conversations``    conversations read from chat records (OpenAI, ShareGPT, alpaca, prompt/completion), and
                       each encoded with its loss mask
- ``chat_prepare``     preparing a chat corpus once: rendered, encoded and labelled on every core, cached
- ``chat_data``        the prepared conversations packed into rows and drawn in resumable batches
"""

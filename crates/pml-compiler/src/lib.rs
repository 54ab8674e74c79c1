//! Compiler: semantic checks of schemas and prompts, chat templates, layout and prompt binding. Knows nothing of tensors.

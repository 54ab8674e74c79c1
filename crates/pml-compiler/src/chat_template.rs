//! Chat templates: what the role tags `<system>`, `<user>` and `<assistant>` expand to for a model.
//!
//! The strings are derived, not hard-coded: the model's Jinja template (`tokenizer.chat_template`
//! in its GGUF) is rendered with minijinja around sentinel messages, and the text between the
//! sentinels gives each role's open and close strings, the generation prompt (the assistant turn
//! start appended at run time), whether the template emits BOS itself, and what it adds before the
//! first turn when no system message is given (Qwen2.5's default system prompt).
//!
//! Templates without a system turn (Gemma-3) fold the system text into the first user turn:
//! `<start_of_turn>user\n{system}\n\n{user}<end_of_turn>\n`. Since a PML `<system>` block is a
//! reusable module of its own, it then becomes **a user turn of its own** (`system` markers equal
//! the `user` markers); [`SystemStyle::FoldedIntoFirstUser`] records the template's separator for
//! callers that prefer to reproduce the folding exactly.

use minijinja::{Environment, Value, context};
use pml_syntax::ast::Role;
use serde::Serialize;

use crate::template_render::{TEMPLATE_NAME, TemplateDate, template_environment};

/// Open and close strings of one role's turn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RoleMarkers {
    pub open: String,
    pub close: String,
}

/// How the template treats a system message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum SystemStyle {
    /// The template has a system turn of its own.
    Native,
    /// The template puts the system text at the start of the first user turn, followed by
    /// `separator` (Gemma-3: `"\n\n"`).
    FoldedIntoFirstUser { separator: String },
    /// The template rejects or drops system messages.
    Unsupported,
}

/// Role strings derived from a chat template. BOS is never included in them: the runtime places
/// BOS at position 0 when the model uses one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChatTemplate {
    /// What a `<system>` block expands to; equal to `user` unless [`SystemStyle::Native`].
    pub system: RoleMarkers,
    pub user: RoleMarkers,
    pub assistant: RoleMarkers,
    /// Appended after the prompt to start the model's answer.
    pub generation_prompt: String,
    /// Whether the template renders the BOS token itself at the start.
    pub emits_bos: bool,
    pub system_style: SystemStyle,
    /// Text the template places before the first turn when no system message is given.
    pub default_preamble: String,
    /// The Jinja source and the token spellings it was analysed with, for rendering whole
    /// conversations (tools, tool calls, tool results: [`crate::conversation`]).
    /// Empty for role strings made by hand (tests): such a template renders no tools.
    #[serde(skip)]
    pub source: String,
    #[serde(skip)]
    pub tokens: TemplateTokens,
}

/// Special-token spellings a template may reference.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TemplateTokens {
    pub bos_token: String,
    pub eos_token: String,
}

/// Why a template could not be analysed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ChatTemplateError {
    #[error("chat template does not compile: {0}")]
    Syntax(String),

    #[error("chat template fails to render a {conversation} conversation: {message}")]
    Render {
        conversation: &'static str,
        message: String,
    },

    #[error(
        "cannot derive role strings from the chat template ({conversation} conversation): {reason}"
    )]
    Unanalysable {
        conversation: &'static str,
        reason: String,
    },
}

impl ChatTemplate {
    /// Analyses the Jinja chat template `source`.
    pub fn from_template(source: &str, tokens: &TemplateTokens) -> Result<Self, ChatTemplateError> {
        let mut template = Analysis::new(source, tokens)?.derive()?;
        template.source = source.to_owned();
        template.tokens = tokens.clone();
        Ok(template)
    }

    /// Open and close strings of `role`.
    pub fn markers(&self, role: Role) -> &RoleMarkers {
        match role {
            Role::System => &self.system,
            Role::User => &self.user,
            Role::Assistant => &self.assistant,
        }
    }

    /// `text` wrapped in `role`'s turn.
    pub fn wrap(&self, role: Role, text: &str) -> String {
        let markers = self.markers(role);
        format!("{}{text}{}", markers.open, markers.close)
    }
}

const BOS_SENTINEL: &str = "PMLSENTINELBOS";
const SYSTEM_SENTINEL: &str = "PMLSENTINELSYSTEM";
const USER_SENTINEL: &str = "PMLSENTINELUSER1";
const ASSISTANT_SENTINEL: &str = "PMLSENTINELASSISTANT";
const USER2_SENTINEL: &str = "PMLSENTINELUSER2";

#[derive(Serialize)]
struct Message {
    role: &'static str,
    content: &'static str,
}

const fn message(role: &'static str, content: &'static str) -> Message {
    Message { role, content }
}

/// A compiled template and the renders the derivation compares.
struct Analysis {
    environment: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl Analysis {
    fn new(source: &str, tokens: &TemplateTokens) -> Result<Self, ChatTemplateError> {
        // As HF transformers renders chat templates.
        let environment = template_environment(source, TemplateDate::Today)
            .map_err(|error| ChatTemplateError::Syntax(error.to_string()))?;
        Ok(Self {
            environment,
            bos_token: tokens.bos_token.clone(),
            eos_token: tokens.eos_token.clone(),
        })
    }

    fn render(
        &self,
        conversation: &'static str,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        let template = self
            .environment
            .get_template(TEMPLATE_NAME)
            .map_err(|error| ChatTemplateError::Syntax(error.to_string()))?;
        template
            .render(context! {
                messages => Value::from_serialize(messages),
                add_generation_prompt => add_generation_prompt,
                bos_token => BOS_SENTINEL,
                eos_token => self.eos_token.as_str(),
            })
            .map_err(|error| ChatTemplateError::Render {
                conversation,
                message: error.to_string(),
            })
    }

    /// Replaces BOS sentinels left inside a derived string with the real BOS spelling.
    fn finish(&self, text: &str) -> String {
        text.replace(BOS_SENTINEL, &self.bos_token)
    }

    fn derive(&self) -> Result<ChatTemplate, ChatTemplateError> {
        let unanalysable =
            |conversation: &'static str, reason: &str| ChatTemplateError::Unanalysable {
                conversation,
                reason: reason.to_owned(),
            };

        // [user]: everything before the sentinel is preamble + user open, everything after is user close.
        let user_only = self.render("user", &[message("user", USER_SENTINEL)], false)?;
        let emits_bos = user_only.starts_with(BOS_SENTINEL);
        let (first_prefix, user_close) = split_once_around(&user_only, USER_SENTINEL)
            .ok_or_else(|| unanalysable("user", "the user text does not appear"))?;

        // [user, assistant]: between the two texts come user close + assistant open.
        let user_assistant = self.render(
            "user/assistant",
            &[
                message("user", USER_SENTINEL),
                message("assistant", ASSISTANT_SENTINEL),
            ],
            false,
        )?;
        let (between, assistant_close) =
            split_between(&user_assistant, USER_SENTINEL, ASSISTANT_SENTINEL).ok_or_else(|| {
                unanalysable("user/assistant", "the texts do not appear in order")
            })?;
        let assistant_open = between.strip_prefix(user_close).ok_or_else(|| {
            unanalysable(
                "user/assistant",
                "the user turn closes differently when followed by an answer",
            )
        })?;

        // [user, assistant, user]: between the assistant text and the second user text come
        // assistant close + user open.
        let three_turns = self.render(
            "user/assistant/user",
            &[
                message("user", USER_SENTINEL),
                message("assistant", ASSISTANT_SENTINEL),
                message("user", USER2_SENTINEL),
            ],
            false,
        )?;
        let (between, _) = split_between(&three_turns, ASSISTANT_SENTINEL, USER2_SENTINEL)
            .ok_or_else(|| {
                unanalysable("user/assistant/user", "the texts do not appear in order")
            })?;
        let user_open = between.strip_prefix(assistant_close).ok_or_else(|| {
            unanalysable(
                "user/assistant/user",
                "the assistant turn closes differently when followed by a user turn",
            )
        })?;
        let preamble = first_prefix.strip_suffix(user_open).ok_or_else(|| {
            unanalysable(
                "user",
                "the first user turn opens differently from later ones",
            )
        })?;

        let with_prompt = self.render(
            "user + generation prompt",
            &[message("user", USER_SENTINEL)],
            true,
        )?;
        let generation_prompt = with_prompt
            .strip_prefix(user_only.as_str())
            .ok_or_else(|| {
                unanalysable(
                    "user + generation prompt",
                    "the generation prompt is not appended at the end",
                )
            })?;

        let user = RoleMarkers {
            open: self.finish(user_open),
            close: self.finish(user_close),
        };
        let (system_style, system) = self.derive_system(user_open, user_close)?;
        Ok(ChatTemplate {
            system: system.unwrap_or_else(|| user.clone()),
            assistant: RoleMarkers {
                open: self.finish(assistant_open),
                close: self.finish(assistant_close),
            },
            user,
            generation_prompt: self.finish(generation_prompt),
            emits_bos,
            system_style,
            default_preamble: self.finish(strip_bos(preamble)),
            source: String::new(),
            tokens: TemplateTokens::default(),
        })
    }

    /// System markers from a [system, user] render, or the folding style when the template has none.
    fn derive_system(
        &self,
        user_open: &str,
        user_close: &str,
    ) -> Result<(SystemStyle, Option<RoleMarkers>), ChatTemplateError> {
        let conversation = "system/user";
        let rendered = match self.render(
            conversation,
            &[
                message("system", SYSTEM_SENTINEL),
                message("user", USER_SENTINEL),
            ],
            false,
        ) {
            Ok(rendered) => rendered,
            Err(ChatTemplateError::Render { .. }) => return Ok((SystemStyle::Unsupported, None)),
            Err(error) => return Err(error),
        };
        let Some((before_system, _)) = split_once_around(&rendered, SYSTEM_SENTINEL) else {
            return Ok((SystemStyle::Unsupported, None));
        };
        let (between, after_user) = split_between(&rendered, SYSTEM_SENTINEL, USER_SENTINEL)
            .ok_or_else(|| ChatTemplateError::Unanalysable {
                conversation,
                reason: "system text does not precede user text".to_owned(),
            })?;
        if after_user != user_close {
            return Err(ChatTemplateError::Unanalysable {
                conversation,
                reason: "the user turn closes differently after a system message".to_owned(),
            });
        }
        if let Some(system_close) = between.strip_suffix(user_open) {
            let markers = RoleMarkers {
                open: self.finish(strip_bos(before_system)),
                close: self.finish(system_close),
            };
            return Ok((SystemStyle::Native, Some(markers)));
        }
        if before_system.ends_with(user_open) {
            return Ok((
                SystemStyle::FoldedIntoFirstUser {
                    separator: self.finish(between),
                },
                None,
            ));
        }
        Err(ChatTemplateError::Unanalysable {
            conversation,
            reason: "the system text is neither a turn of its own nor part of the first user turn"
                .to_owned(),
        })
    }
}

fn strip_bos(text: &str) -> &str {
    text.strip_prefix(BOS_SENTINEL).unwrap_or(text)
}

/// The text before and after the single occurrence of `sentinel`.
fn split_once_around<'a>(text: &'a str, sentinel: &str) -> Option<(&'a str, &'a str)> {
    let (before, after) = text.split_once(sentinel)?;
    if after.contains(sentinel) {
        None
    } else {
        Some((before, after))
    }
}

/// The text between `first` and `second` (in that order), and the text after `second`.
fn split_between<'a>(text: &'a str, first: &str, second: &str) -> Option<(&'a str, &'a str)> {
    let (_, after_first) = split_once_around(text, first)?;
    split_once_around(after_first, second)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen() -> Result<ChatTemplate, ChatTemplateError> {
        let source = include_str!("../tests/data/chat_templates/qwen2.5-coder-0.5b-instruct.jinja");
        let tokens = TemplateTokens {
            bos_token: "<|endoftext|>".to_owned(),
            eos_token: "<|im_end|>".to_owned(),
        };
        ChatTemplate::from_template(source, &tokens)
    }

    fn gemma() -> Result<ChatTemplate, ChatTemplateError> {
        // The engine's built-in Gemma-3 template (`pml_engine::chat::builtin_template`); the
        // runtime's `chat_template_models` test checks that this copy has not drifted.
        let source = include_str!("../tests/data/chat_templates/gemma3.jinja");
        let tokens = TemplateTokens {
            bos_token: "<bos>".to_owned(),
            eos_token: "<eos>".to_owned(),
        };
        ChatTemplate::from_template(source, &tokens)
    }

    fn markers(open: &str, close: &str) -> RoleMarkers {
        RoleMarkers {
            open: open.to_owned(),
            close: close.to_owned(),
        }
    }

    #[test]
    fn qwen_chatml_roles() -> Result<(), ChatTemplateError> {
        let template = qwen()?;
        assert_eq!(
            template.system,
            markers("<|im_start|>system\n", "<|im_end|>\n")
        );
        assert_eq!(template.user, markers("<|im_start|>user\n", "<|im_end|>\n"));
        assert_eq!(
            template.assistant,
            markers("<|im_start|>assistant\n", "<|im_end|>\n")
        );
        assert_eq!(template.generation_prompt, "<|im_start|>assistant\n");
        assert!(!template.emits_bos);
        assert_eq!(template.system_style, SystemStyle::Native);
        assert_eq!(
            template.default_preamble,
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        );
        assert_eq!(
            template.wrap(Role::User, "hi"),
            "<|im_start|>user\nhi<|im_end|>\n"
        );
        Ok(())
    }

    #[test]
    fn gemma_turns_and_folded_system() -> Result<(), ChatTemplateError> {
        let template = gemma()?;
        assert_eq!(
            template.user,
            markers("<start_of_turn>user\n", "<end_of_turn>\n")
        );
        assert_eq!(
            template.assistant,
            markers("<start_of_turn>model\n", "<end_of_turn>\n")
        );
        assert_eq!(
            template.system, template.user,
            "a <system> block becomes a user turn of its own"
        );
        assert_eq!(template.generation_prompt, "<start_of_turn>model\n");
        assert!(template.emits_bos);
        assert_eq!(
            template.system_style,
            SystemStyle::FoldedIntoFirstUser {
                separator: "\n\n".to_owned()
            }
        );
        assert_eq!(template.default_preamble, "");
        Ok(())
    }

    #[test]
    fn bos_inside_turns_is_spelled_out() -> Result<(), ChatTemplateError> {
        // Llama-2 style: BOS opens every user turn, EOS closes every answer, no system turn.
        let source = "{% for m in messages %}{% if m.role == 'user' %}{{ bos_token + '[INST] ' + m.content + ' [/INST]' }}\
                      {% elif m.role == 'assistant' %}{{ ' ' + m.content + ' ' + eos_token }}\
                      {% else %}{{ raise_exception('no system') }}{% endif %}{% endfor %}";
        let tokens = TemplateTokens {
            bos_token: "<s>".to_owned(),
            eos_token: "</s>".to_owned(),
        };
        let template = ChatTemplate::from_template(source, &tokens)?;
        assert!(template.emits_bos);
        assert_eq!(template.user, markers("<s>[INST] ", " [/INST]"));
        assert_eq!(template.assistant, markers(" ", " </s>"));
        assert_eq!(template.generation_prompt, "");
        assert_eq!(template.system_style, SystemStyle::Unsupported);
        assert_eq!(template.system, template.user);
        Ok(())
    }

    #[test]
    fn broken_and_opaque_templates_are_typed_errors() {
        let tokens = TemplateTokens::default();
        assert!(matches!(
            ChatTemplate::from_template("{% for %}", &tokens),
            Err(ChatTemplateError::Syntax(_))
        ));
        assert!(matches!(
            ChatTemplate::from_template("{{ raise_exception('nope') }}", &tokens),
            Err(ChatTemplateError::Render {
                conversation: "user",
                ..
            })
        ));
        assert!(matches!(
            ChatTemplate::from_template("fixed text", &tokens),
            Err(ChatTemplateError::Unanalysable {
                conversation: "user",
                ..
            })
        ));
    }
}

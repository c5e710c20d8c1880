//! Where the live instance of a supervised actor is.
//!
//! Handles never hold an `ActorRef` of their own: a restarted actor is a new
//! actor with a new reference, and handles given out before the crash must
//! reach it. The supervisor publishes the current reference in a [`Slot`];
//! every call reads it, and a call that finds the actor dead waits (bounded)
//! for the supervisor to publish its successor.

use std::sync::Arc;
use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{ActorId, ActorRef, Message, MessagingErr, RpcReplyPort};
use tokio::sync::watch;

use crate::error::RuntimeError;

/// What a slot holds.
#[derive(Debug)]
enum SlotState<M> {
    /// The actor is being (re)started; calls wait.
    Starting,
    /// The actor to talk to.
    Live(ActorRef<M>),
    /// The actor is gone for good; calls fail with this reason.
    Gone(String),
}

impl<M> Clone for SlotState<M> {
    fn clone(&self) -> Self {
        match self {
            Self::Starting => Self::Starting,
            Self::Live(actor) => Self::Live(actor.clone()),
            Self::Gone(reason) => Self::Gone(reason.clone()),
        }
    }
}

/// The published reference of one supervised actor, shared by the
/// supervisor (writer) and every handle (readers).
pub(crate) struct Slot<M> {
    /// Names the actor in errors ("provider", "agent `shop`").
    label: String,
    state: watch::Sender<SlotState<M>>,
}

impl<M: Message> Slot<M> {
    pub(crate) fn new(label: impl Into<String>) -> Arc<Self> {
        let (state, _) = watch::channel(SlotState::Starting);
        Arc::new(Self {
            label: label.into(),
            state,
        })
    }

    pub(crate) fn label(&self) -> &str {
        &self.label
    }

    pub(crate) fn set_live(&self, actor: ActorRef<M>) {
        self.state.send_replace(SlotState::Live(actor));
    }

    pub(crate) fn set_starting(&self) {
        self.state.send_replace(SlotState::Starting);
    }

    pub(crate) fn set_gone(&self, reason: impl Into<String>) {
        self.state.send_replace(SlotState::Gone(reason.into()));
    }

    /// The live actor, waiting up to `wait` while it is (re)starting.
    /// `not` skips an instance the caller already found dead, so a call
    /// that raced a crash waits for the successor instead of retrying the
    /// corpse.
    async fn live(
        &self,
        wait: Duration,
        not: Option<ActorId>,
    ) -> Result<ActorRef<M>, RuntimeError> {
        let mut rx = self.state.subscribe();
        let found = tokio::time::timeout(
            wait,
            rx.wait_for(|state| match state {
                SlotState::Live(actor) => Some(actor.get_id()) != not,
                SlotState::Gone(_) => true,
                SlotState::Starting => false,
            }),
        )
        .await;
        match found {
            Err(_) => Err(RuntimeError::Timeout {
                actor: self.label.clone(),
                after: wait,
            }),
            // The sender lives in `self`, so the channel cannot close while we wait.
            Ok(Err(_)) => Err(self.gone("the runtime was dropped")),
            Ok(Ok(state)) => match &*state {
                SlotState::Live(actor) => Ok(actor.clone()),
                SlotState::Gone(reason) => Err(self.gone(reason)),
                SlotState::Starting => unreachable!("wait_for returned a state it rejects"),
            },
        }
    }

    fn gone(&self, reason: &str) -> RuntimeError {
        RuntimeError::Unavailable {
            actor: self.label.clone(),
            reason: reason.to_string(),
        }
    }

    /// Calls the live actor with a timeout. A message that could not be
    /// delivered (the actor died between the lookup and the send) is built
    /// again for the restarted actor, which is safe because nobody saw it.
    pub(crate) async fn call<T, F>(
        &self,
        build: F,
        timeout: Duration,
        restart_wait: Duration,
    ) -> Result<T, RuntimeError>
    where
        T: Send + 'static,
        F: Fn(RpcReplyPort<T>) -> M,
    {
        let mut dead: Option<ActorId> = None;
        loop {
            let actor = self.live(restart_wait, dead).await?;
            match actor.call(&build, Some(timeout)).await {
                Ok(CallResult::Success(value)) => return Ok(value),
                Ok(CallResult::Timeout) => {
                    return Err(RuntimeError::Timeout {
                        actor: self.label.clone(),
                        after: timeout,
                    });
                }
                // The actor took the message and dropped the reply: it died
                // while handling it. The message may have had effects, so it
                // is not sent again.
                Ok(CallResult::SenderError) => {
                    return Err(self.gone("it stopped while handling the request"));
                }
                Err(MessagingErr::SendErr(_) | MessagingErr::ChannelClosed) => {
                    dead = Some(actor.get_id());
                }
                Err(MessagingErr::InvalidActorType) => {
                    return Err(self.gone("it has an unexpected message type"));
                }
            }
        }
    }
}

//! Stages: code that acts on messages on their way, at three sites of the path, once per
//! batch. A stage is built from its factory once per task that runs it (a client
//! connection for [`Site::Origin`], a link for [`Site::Relay`] and [`Site::Delivery`]), so an
//! instance with state of its own needs no lock shared between tasks.
//!
//! Invariant: a chain runs outside the admission lock and every queue's lock: before a
//! batch is placed. A stage may change a message's payload, headers and name, never its
//! reliability or priority; only the filters' `on_route`, at the origin, changes recipients
//! (the origin places a run after its stages, splitting it where the recipients differ).

use std::sync::Arc;

use linkbus_plugin_api::{Message, NodeName};

use super::refusal::{Refusal, RefusalCode};

/// Where on its path a message meets a stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Site {
    /// At the origin: a client's put, checked and stamped, before it is placed.
    Origin,
    /// At a relay: a message that arrived on a link, before it goes on by another link.
    Relay,
    /// At the destination: a message that arrived on a link, before it goes into a queue.
    Delivery,
}

/// Where a stage's instance runs.
#[derive(Debug, Clone, Copy)]
pub struct StageContext<'a> {
    /// This node.
    pub node: &'a NodeName,
    /// The site.
    pub site: Site,
    /// The peer of the link the instance serves (none at the origin).
    pub peer: Option<&'a NodeName>,
}

/// Builds a stage's instances: one per task that runs it.
pub trait StageFactory: Send + Sync {
    /// The stage's name (in logs and refusals).
    fn name(&self) -> &str;

    /// The instance for `context`, or `None` where the stage does not run.
    fn build(&self, context: &StageContext<'_>) -> Option<Box<dyn Stage>>;
}

/// One instance of a stage.
pub trait Stage: Send {
    /// Acts on one batch of messages, in order.
    fn run(&mut self, batch: &mut StageBatch<'_, '_>);

    /// Whether it has nothing to do now (the filter stage while no filter is configured):
    /// a chain of idle stages is skipped without gathering the batch for it.
    fn is_idle(&self) -> bool {
        false
    }
}

/// A batch a stage acts on: the messages, which it may change in place, and refusals.
#[derive(Debug)]
pub struct StageBatch<'a, 'm> {
    messages: &'a mut [&'m mut Message],
    refused: &'a mut Vec<(usize, Refusal)>,
    rerouted: &'a mut bool,
    stage: &'a str,
}

impl<'m> StageBatch<'_, 'm> {
    /// The batch's messages, in order.
    pub fn messages(&mut self) -> &mut [&'m mut Message] {
        self.messages
    }

    /// Refuses the message at `index`: at the origin the put is refused from it on, on a
    /// link it goes to the dead-letter queue. Later stages still see it.
    pub fn refuse(&mut self, index: usize, reason: impl Into<String>) {
        self.mark(index, RefusalCode::Filtered, "refused it", &reason.into());
    }

    /// Records that the stage failed on the message at `index` (it could not do its work:
    /// a trap, a timeout, a missing resource), as opposed to refusing it: at the origin the
    /// put is refused from it on, on a link it is dead-lettered with `stage_failed`. Later
    /// stages still see it.
    pub fn fail(&mut self, index: usize, reason: impl Into<String>) {
        self.mark(index, RefusalCode::StageFailed, "failed", &reason.into());
    }

    /// Records the first refusal of the message at `index`: `code`, and why in the stage's
    /// name (`stage 'NAME' DID: REASON`).
    fn mark(&mut self, index: usize, code: RefusalCode, did: &str, reason: &str) {
        self.mark_as(index, code, format!("stage '{}' {did}: {reason}", self.stage));
    }

    /// Records the first refusal of the message at `index`: `code`, and `reason` as it is
    /// (the filter stage names the filter itself). [`RefusalCode::Dropped`] removes it
    /// without a dead letter.
    pub(crate) fn mark_as(&mut self, index: usize, code: RefusalCode, reason: String) {
        if index < self.messages.len() && !self.is_refused(index) {
            self.refused.push((index, Refusal::new(code, reason)));
        }
    }

    /// Records that the stage set a message's recipients (a filter's `on_route`, at the
    /// origin): the run is cut again where recipients differ before it is placed.
    pub(crate) fn rerouted(&mut self) {
        *self.rerouted = true;
    }

    /// Whether the message at `index` was refused by an earlier stage or this one.
    pub fn is_refused(&self, index: usize) -> bool {
        self.refused.iter().any(|(i, _)| *i == index)
    }
}

/// The stages of one site, in order, as built for one task.
#[derive(Default)]
pub(crate) struct Stages {
    chain: Vec<(String, Box<dyn Stage>)>,
    /// Whether the last run set some message's recipients.
    rerouted: bool,
}

impl std::fmt::Debug for Stages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.chain.iter().map(|(name, _)| name)).finish()
    }
}

impl Stages {
    /// The chain of `factories` that run at `context`'s site.
    pub(crate) fn build(factories: &[Arc<dyn StageFactory>], context: &StageContext<'_>) -> Self {
        let chain = factories
            .iter()
            .filter_map(|factory| Some((factory.name().to_owned(), factory.build(context)?)))
            .collect();
        Self { chain, rerouted: false }
    }

    /// Whether no stage runs here (none was built for this site, or each is idle).
    pub(crate) fn is_empty(&self) -> bool {
        self.chain.iter().all(|(_, stage)| stage.is_idle())
    }

    /// Runs the chain over `messages`; returns the refused ones' places (ascending) and why.
    pub(crate) fn run(&mut self, messages: &mut [&mut Message]) -> Vec<(usize, Refusal)> {
        let mut refused = Vec::new();
        self.rerouted = false;
        for (name, stage) in &mut self.chain {
            let rerouted = &mut self.rerouted;
            stage.run(&mut StageBatch { messages, refused: &mut refused, rerouted, stage: name });
        }
        refused.sort_by_key(|(index, _)| *index);
        refused
    }

    /// Whether the last [`Stages::run`] set some message's recipients.
    pub(crate) fn rerouted(&self) -> bool {
        self.rerouted
    }
}

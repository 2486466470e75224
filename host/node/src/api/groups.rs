//! The group rules of a client connection.
//!
//! Puts: a connection has at most one group open (its last member not yet put). Its next
//! member must follow in index order, with the group's priority and recipients; a member of
//! another group while one is open is refused — groups neither nest nor interleave. A
//! connection may take up a group at any index (a sender that crashed puts the rest).
//!
//! Gets handed out pending: a group is acknowledged after its last member — acknowledging
//! the last member's tag acknowledges every member handed out here — and a connection that
//! holds a finished group unacknowledged gets nothing more until it acknowledges or backs
//! it out (TongLink/Q's rule).

use std::sync::Arc;

use linkbus_plugin_api::{Content, Group, Priority, Recipients};

use crate::queue::{GroupKey, LocalQueue};

/// What the rules need of a put's content.
#[derive(Debug, Clone)]
pub(super) struct Member {
    group: Option<Group>,
    priority: Priority,
    recipients: Recipients,
}

impl Member {
    pub(super) fn of(content: &Content) -> Self {
        Self {
            group: content.group.clone(),
            priority: content.priority,
            recipients: content.recipients.clone(),
        }
    }
}

/// The group a connection's puts are inside, if any.
#[derive(Debug, Clone, Default)]
pub(super) struct PutGroups {
    open: Option<Open>,
}

#[derive(Debug, Clone)]
struct Open {
    id: String,
    next: u32,
    priority: Priority,
    recipients: Recipients,
}

impl PutGroups {
    /// What the rules need of `contents`: nothing (no copy made) when none is in a group,
    /// as messages outside groups neither open nor close one.
    pub(super) fn members(contents: &[Content]) -> Vec<Member> {
        if contents.iter().all(|c| c.group.is_none()) {
            return Vec::new();
        }
        contents.iter().map(Member::of).collect()
    }

    /// Moves on by the first `accepted` of `members` (checked by [`PutGroups::after`]; a
    /// prefix of puts that keep the rules keeps them).
    pub(super) fn accepted(&mut self, members: &[Member], accepted: usize) {
        if let Ok(after) = self.after(&members[..accepted.min(members.len())]) {
            *self = after;
        }
    }

    /// The state after putting `members` in order, or the first rule one breaks (with its
    /// position, from 1, in the message).
    pub(super) fn after(&self, members: &[Member]) -> Result<Self, String> {
        let mut open = self.open.clone();
        for (i, member) in members.iter().enumerate() {
            let Some(group) = &member.group else { continue };
            let n = i + 1;
            if let Some(o) = &open {
                if o.id != group.id {
                    return Err(format!(
                        "message {n}: group '{}' begins while group '{}' is open (index {} not put yet): groups \
                         neither nest nor interleave, one ends (its member marked last) before the next begins",
                        group.id, o.id, o.next
                    ));
                }
                if group.index != o.next {
                    return Err(format!(
                        "message {n}: member {} of group '{}' is out of order: members are put in index order, \
                         and {} comes next",
                        group.index, group.id, o.next
                    ));
                }
                if member.priority != o.priority || member.recipients != o.recipients {
                    return Err(format!(
                        "message {n}: member {} of group '{}' has another priority or other recipients than \
                         the members before it: a group's members share them",
                        group.index, group.id
                    ));
                }
            }
            open = (!group.last).then(|| Open {
                id: group.id.clone(),
                next: group.index.saturating_add(1),
                priority: member.priority,
                recipients: member.recipients.clone(),
            });
        }
        Ok(Self { open })
    }
}

/// A group whose members were handed out pending on a connection.
struct Handed {
    queue: Arc<LocalQueue>,
    group: GroupKey,
    /// Tags of its members handed out here and not yet settled.
    tags: Vec<u64>,
    /// The last member's tag, once it was handed out.
    last: Option<u64>,
}

/// The groups handed out pending on a connection (see the module doc).
#[derive(Default)]
pub(super) struct HandedGroups {
    groups: Vec<Handed>,
}

impl HandedGroups {
    /// Notes the group members among messages handed out pending from `queue`.
    pub(super) fn add(
        &mut self,
        queue: &Arc<LocalQueue>,
        messages: &[linkbus_plugin_api::Message],
        tags: &[u64],
    ) {
        for (message, &tag) in messages.iter().zip(tags) {
            let (Some(group), Some(member)) = (GroupKey::of(message), message.content.group.as_ref()) else {
                continue;
            };
            let at = self.groups.iter().position(|h| Arc::ptr_eq(&h.queue, queue) && h.group == group);
            let handed = match at {
                Some(at) => &mut self.groups[at],
                None => {
                    self.groups.push(Handed { queue: queue.clone(), group, tags: Vec::new(), last: None });
                    let end = self.groups.len() - 1;
                    &mut self.groups[end]
                }
            };
            handed.tags.push(tag);
            if member.last {
                handed.last = Some(tag);
            }
        }
    }

    /// Why this connection may get nothing more now: a finished group not acknowledged.
    pub(super) fn blocked(&self) -> Option<String> {
        let h = self.groups.iter().find(|h| h.last.is_some())?;
        Some(format!(
            "group {} from queue '{}' was handed out whole and is not acknowledged: acknowledge it (the last \
             member's tag {} acknowledges every member) or back it out before getting more messages",
            h.group,
            h.queue.config().name,
            h.last.unwrap_or_default()
        ))
    }

    /// The tags an acknowledgement of `tags` in `queue` settles: the last member's tag
    /// brings every member handed out here. Refused for a member of a group whose last
    /// member was not handed out here yet while the queue still holds the group (`ack`: an
    /// acknowledgement; a backout may). (A group whose last member will not come here — a
    /// dead letter, a last member that expired — is acknowledged member by member.)
    pub(super) fn settling<'t>(
        &self,
        queue: &Arc<LocalQueue>,
        tags: &'t [u64],
        ack: bool,
    ) -> Result<std::borrow::Cow<'t, [u64]>, String> {
        let mut all = std::borrow::Cow::Borrowed(tags);
        for h in self.groups.iter().filter(|h| Arc::ptr_eq(&h.queue, queue)) {
            let Some(tag) = tags.iter().find(|t| h.tags.contains(t)) else { continue };
            match h.last {
                None if ack && queue.holds_group(&h.group) => {
                    return Err(format!(
                        "tag {tag} is a member of group {}, whose last member this connection has not \
                         received: a group is acknowledged after its last member",
                        h.group
                    ));
                }
                Some(last) if tags.contains(&last) => {
                    all.to_mut().extend(h.tags.iter().filter(|t| !tags.contains(t)));
                }
                _ => {}
            }
        }
        Ok(all)
    }

    /// Forgets settled tags (and groups with none left).
    pub(super) fn settled(&mut self, queue: &Arc<LocalQueue>, tags: &[u64]) {
        for h in self.groups.iter_mut().filter(|h| Arc::ptr_eq(&h.queue, queue)) {
            h.tags.retain(|t| !tags.contains(t));
        }
        self.groups.retain(|h| !h.tags.is_empty());
    }
}

//! What the statement that reads lapsed (and, for one unlimited queue, due) tasks returned,
//! sorted by what the claim does next, and the group's slots it claims due tasks for.

use leasehold::tasks::TaskStatus;

use super::Want;
use crate::repo::{self, TaskRow};

/// [`repo::take_lapsed`]'s rows, by what the claim does with them next.
#[derive(Debug, Default)]
pub(super) struct Taken {
    /// Ended as cancelled.
    pub(super) cancelled: Vec<TaskRow>,
    /// Lapsed, to be granted: the claimable first, then the exhausted, each oldest first.
    pub(super) lapsed: Vec<TaskRow>,
    /// Due, locked, in the claim's order, to be granted.
    pub(super) due: Vec<TaskRow>,
    /// Due, claimed already, with their slots, in slot order.
    pub(super) claimed: Vec<(usize, TaskRow)>,
}

pub(super) fn split_lapsed(rows: Vec<repo::Taken>) -> Taken {
    let mut taken = Taken::default();
    for row in rows {
        let repo::Taken { task, claim_slot } = row;
        match (claim_slot, task.status) {
            (Some(slot), _) => taken
                .claimed
                .push((usize::try_from(slot).unwrap_or(0), task)),
            (None, TaskStatus::Pending) => taken.due.push(task),
            (None, TaskStatus::Cancelled) => taken.cancelled.push(task),
            (None, _) => taken.lapsed.push(task),
        }
    }
    // Stable: each kind keeps the statement's order.
    taken.lapsed.sort_by_key(exhausted);
    taken.claimed.sort_by_key(|(slot, _)| *slot);
    taken
}

/// The group's slots, one per task a request may take (a request with a `limit` of `n` holds
/// `n`, in the group's order), for [`repo::take_lapsed`] to claim the due tasks of those
/// whose request named its worker process's lease.
pub(super) fn slots(wants: &[Want], hint: std::time::Duration) -> repo::Slots<'_> {
    let mut slots = repo::Slots {
        processors: Vec::new(),
        resources: Vec::new(),
        fences: Vec::new(),
        hint,
    };
    let holders = (1..).map_while(|slot| owner_of(wants, slot).map(|owner| &wants[owner]));
    for want in holders {
        slots.processors.push(want.processor.as_str());
        slots
            .resources
            .push(want.lease.as_ref().map(|(resource, _)| resource.as_str()));
        slots
            .fences
            .push(want.lease.as_ref().map_or(0, |(_, fence)| *fence));
    }
    slots
}

/// The request that holds `slot` (from 1) of a group ([`slots`]).
pub(super) fn owner_of(wants: &[Want], slot: usize) -> Option<usize> {
    let mut end = 0;
    wants.iter().position(|want| {
        end += usize::try_from(want.limit).unwrap_or(0);
        slot <= end
    })
}

/// A task that has used all its attempts: it is never handed out again.
pub(super) fn exhausted(task: &TaskRow) -> bool {
    task.attempts >= task.max_attempts
}

//! How the generator's status prints.

use leasehold::generator::GeneratorStatus;

use super::{or_dash, table, time};

pub(crate) fn generator_table(status: &GeneratorStatus) -> String {
    let leader = status.leader.as_ref();
    let rows = vec![
        vec!["desired".to_owned(), status.status.clone()],
        vec!["producing".to_owned(), status.producing.to_string()],
        vec![
            "rate per second".to_owned(),
            status.settings.rate_per_second.to_string(),
        ],
        vec!["produced".to_owned(), status.produced.to_string()],
        vec![
            "leader".to_owned(),
            or_dash(leader.map(|l| l.holder.clone())),
        ],
        vec![
            "leader fence".to_owned(),
            or_dash(leader.map(|l| l.fence.to_string())),
        ],
        vec![
            "leading since".to_owned(),
            or_dash(leader.map(|l| time(&l.since))),
        ],
    ];
    table(&["GENERATOR", "VALUE"], &rows)
}

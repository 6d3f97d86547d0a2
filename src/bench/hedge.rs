//! `tailcut bench hedge`: hedging off vs on over two `spiky` simulated routes.

#[derive(Debug, Clone, clap::Args)]
pub struct HedgeArgs {
    /// Requests per run.
    #[arg(long, default_value_t = 2000)]
    pub requests: usize,
}

pub async fn hedge(_args: HedgeArgs) -> Result<(), String> {
    Err("the hedge benchmark is not built yet".into())
}

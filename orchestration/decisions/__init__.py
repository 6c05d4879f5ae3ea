"""The operator's decisions as Dagster jobs: what `exactly skip` and `exactly recover` do, from
the Launchpad, with the same rules and the same one-sentence refusals."""

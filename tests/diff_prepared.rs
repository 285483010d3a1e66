//! Differential tests of the prepared-statement cache (issue 3): every scenario in
//! `tests/diff/*.txt` runs directly against PostgreSQL and through parsnip with a pool
//! smaller than the number of clients, and the transcripts must match (see `diff/mod.rs`
//! for the scenario format).
//!
//! Scenarios whose name starts with `intentional_` assert parsnip's intended behaviour
//! where it differs from PostgreSQL on purpose (issue 3 "Behaviour" 5-7); their steps carry
//! `parsnip:` / `alt:` expectations instead of transcript equality.
//!
//! `DIFF_SHOW=1 cargo test --test diff_prepared -- --nocapture` prints every transcript.

mod diff;
mod support;

/// One `#[tokio::test]` per scenario, grouped by file; `$(#[...])*` carries `#[ignore]`.
macro_rules! scenarios {
    ($($file:ident => [$($(#[$meta:meta])* $name:ident),* $(,)?]),* $(,)?) => {
        $(
            mod $file {
                pub const PATH: &str = concat!("tests/diff/", stringify!($file), ".txt");
                pub const TEXT: &str = include_str!(concat!("diff/", stringify!($file), ".txt"));
                pub const NAMES: &[&str] = &[$(stringify!($name)),*];
                $(
                    $(#[$meta])*
                    #[tokio::test]
                    async fn $name() {
                        crate::diff::run(PATH, TEXT, stringify!($name)).await;
                    }
                )*
            }
        )*

        /// Every scenario in the files has a test, and every test a scenario.
        #[test]
        fn every_scenario_has_a_test() {
            $(
                let mut in_file = diff::names($file::PATH, $file::TEXT);
                in_file.sort();
                let mut listed: Vec<String> = $file::NAMES.iter().map(|s| s.to_string()).collect();
                listed.sort();
                assert_eq!(in_file, listed, "scenarios of {} vs the test list", $file::PATH);
            )*
        }
    };
}

scenarios! {
    autoprepare => [
        autoprepare_select_insert_update,
        autoprepare_after_ddl,
        autoprepare_in_transaction_blocks,
        autoprepare_grammar_constants,
        autoprepare_syntax_errors,
        autoprepare_writes_in_blocks_follow_ddl,
        reads_in_blocks_follow_ddl,
    ],
    named => [
        named_one_batch,
        named_split_across_syncs_three_clients,
        named_interleaved_transactions,
        named_query_and_extended_in_one_write,
        named_transaction_control_statements,
        same_name_different_sql,
        same_sql_different_names,
        same_sql_different_param_types,
        same_sql_different_search_path,
        describe_statement_with_params,
        concurrent_pipelines_three_clients,
        describe_from_cache_follows_schema_changes,
        intentional_describe_from_cache_misses_ddl_it_cannot_see,
        intentional_named_parse_inside_a_deferred_block,
    ],
    errors => [
        parse_existing_name_42p05,
        unknown_statement_and_portal,
        failed_parse_name_reusable,
        error_mid_pipeline,
        error_mid_pipeline_injected_parse,
        errors_in_transaction_25p02,
        statements_survive_rollback,
        failed_transaction_parse_then_reuse,
    ],
    unnamed => [
        unnamed_across_syncs_other_client_between,
        unnamed_dropped_as_postgres_drops_it,
        unnamed_describe_then_bind_later,
        unnamed_asyncpg_style,
        promotion_repeated_unnamed,
        promotion_in_transactions_and_errors,
        promotion_disabled,
    ],
    sql => [
        sql_prepare_execute_across_checkouts,
        sql_and_protocol_share_namespace,
        sql_prepare_case_and_quoting,
        sql_deallocate_all_pipelined,
        sql_discard_all_and_plans,
        sql_prepare_in_transactions,
        sql_in_multi_statement_query,
        sql_in_multi_statement_query_evicted,
        sql_in_multi_statement_query_stale,
        sql_execute_after_eviction,
        sql_execute_after_eviction_fails_to_prepare,
        sql_execute_inside_explain_and_create_table_as,
        sql_script_prepare_of_a_known_statement_fails,
    ],
    view => [
        view_lists_each_clients_own_statements,
        view_after_names_in_flight_and_scripts,
    ],
    portals_copy => [
        flush_without_sync,
        portal_suspended_in_transaction,
        portal_suspended_flush_outside_transaction,
        copy_from_stdin_extended,
        copy_from_stdin_extended_one_write,
        copy_from_stdin_extended_sync_inside,
        copy_from_stdin_extended_other_message_inside,
        copy_from_stdin_extended_parse_after_copy_in_response,
        copy_to_stdout_extended,
    ],
    invalidation => [
        alter_shape_change_named,
        alter_fresh_client_after_alter,
        alter_column_type_change,
        alter_shape_unchanged,
        alter_inside_transaction,
        alter_then_fresh_parse_inside_transaction,
        alter_then_fresh_parse_in_transaction_batch,
        alter_then_parse_in_the_batch_that_begins,
        alter_then_parse_in_tx_with_commit_pipelined,
        alter_then_cursor_read_in_tx,
        alter_then_parse_of_nodata_in_tx,
        alter_by_the_client_after_its_parse_in_transaction,
        alter_then_sql_prepare_inside_transaction,
        alter_then_sql_prepare,
        alter_under_promoted_unnamed,
        alter_sql_prepared,
        alter_under_unnamed_described_then_bound_elsewhere,
        intentional_retry_when_batch_describes_portal,
        intentional_server_lost_statements,
        type_dropped_and_recreated_under_a_cached_statement,
    ],
    limits => [
        eviction_rotation,
        eviction_after_batch_over_cap,
        eviction_with_flush_and_pipeline_errors,
        registry_cap_rotation,
        intentional_client_cap,
    ],
    regressions => [
        pipelined_after_failed_parse_reuses_name,
        pipelined_after_error_close_is_skipped,
        pipelined_after_error_injected_parse,
        pipelined_after_error_skipped_parse,
        parse_existing_name_in_failed_transaction,
        unnamed_survives_other_clients_query,
        unnamed_dropped_by_own_query,
        fresh_prepare_after_alter,
        promoted_unnamed_after_alter,
        flush_keeps_server_pinned,
        sql_execute_errors_use_client_names,
        intentional_sql_prepare_counts_toward_client_cap,
        alter_after_shape_seen_by_describe_portal,
        promoted_unnamed_in_transaction_after_alter,
        extended_deallocate_all_from_another_client,
        stale_statement_after_begin_in_same_batch,
        stale_statement_after_write_in_same_batch,
        describe_portal_of_plain_bind_after_cached_bind,
        parse_rollback_again_in_failed_transaction,
        extended_deallocate_all_pipelined_with_reparse,
        extended_deallocate_all_keeps_shared_statements,
        extended_deallocate_all_named,
        fresh_parse_after_alter_then_old_describer,
        extended_deallocate_all_after_rollback_in_failed_transaction,
        promoted_unnamed_reuse_follows_search_path_and_types,
        extended_set_stays_with_its_client,
        extended_set_mixed_with_simple_transactions,
        pdo_set_names_then_other_client,
        pdo_set_synonyms_then_other_client,
        pdo_parameter_types_after_recreate,
    ],
}

/// The harness itself: a step whose answer differs from what it must be fails the test.
#[tokio::test]
#[should_panic(expected = "parsnip differs from its spec")]
async fn harness_reports_a_difference() {
    let text =
        "=== harness_self_check\nA: Q \"SELECT 1 AS one\"\n  parsnip: T(one:int4); D[\"2\"]; C(SELECT 1); Z(I)\n";
    diff::run("(inline)", text, "harness_self_check").await;
}

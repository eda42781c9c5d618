"""Initial schema: sweeps, arms, tasks, attempts, requests, agent events, replay runs and results.

Revision ID: 0001
Revises:
Create Date: 2026-12-02 10:28:14.078364
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "sweeps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("created", sa.DateTime(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("finished", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "tasks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("suite", sa.String(length=100), nullable=False),
        sa.Column("instance_id", sa.String(length=300), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("suite", "instance_id", name="uq_tasks_suite_instance"),
    )
    op.create_table(
        "arms",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("model", sa.String(length=500), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("git_commit", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweeps.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("sweep_id", "name", name="uq_arms_sweep_name"),
    )
    with op.batch_alter_table("arms", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_arms_sweep_id"), ["sweep_id"], unique=False)

    op.create_table(
        "replay_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("corpus", sa.String(length=500), nullable=False),
        sa.Column("sweep_id", sa.Integer(), nullable=True),
        sa.Column("created", sa.DateTime(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweeps.id"], ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "attempts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("arm_id", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=False),
        sa.Column("attempt_index", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("tries", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(length=200), nullable=True),
        sa.Column("lease_until", sa.DateTime(), nullable=True),
        sa.Column("started", sa.DateTime(), nullable=True),
        sa.Column("finished", sa.DateTime(), nullable=True),
        sa.Column("resolved", sa.Boolean(), nullable=True),
        sa.Column("exit_status", sa.String(length=100), nullable=True),
        sa.Column("patch", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("decode_tok_s", sa.Float(), nullable=True),
        sa.Column("decode_seconds", sa.Float(), nullable=True),
        sa.Column("drafts", sa.Integer(), nullable=False),
        sa.Column("draft_tokens", sa.Integer(), nullable=False),
        sa.Column("accepted_tokens", sa.Integer(), nullable=False),
        sa.Column("acceptance_rate", sa.Float(), nullable=True),
        sa.Column("acceptance_length", sa.Float(), nullable=True),
        sa.Column("wall_seconds", sa.Float(), nullable=True),
        sa.Column("agent_seconds", sa.Float(), nullable=True),
        sa.Column("eval_seconds", sa.Float(), nullable=True),
        sa.Column("extra", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["arm_id"], ["arms.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweeps.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["task_id"], ["tasks.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("sweep_id", "arm_id", "task_id", "attempt_index", name="uq_attempts_cell"),
    )
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_attempts_arm_id"), ["arm_id"], unique=False)
        batch_op.create_index("ix_attempts_claim", ["sweep_id", "status", "attempt_index"], unique=False)
        batch_op.create_index(batch_op.f("ix_attempts_task_id"), ["task_id"], unique=False)

    op.create_table(
        "replay_results",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("replay_id", sa.Integer(), nullable=False),
        sa.Column("arm", sa.String(length=100), nullable=False),
        sa.Column("run_index", sa.Integer(), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("decode_seconds", sa.Float(), nullable=False),
        sa.Column("pooled_tok_s", sa.Float(), nullable=False),
        sa.Column("acceptance_length", sa.Float(), nullable=True),
        sa.Column("per_position", sa.JSON(), nullable=False),
        sa.Column("spans", sa.JSON(), nullable=False),
        sa.Column("extra", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["replay_id"], ["replay_runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("replay_id", "arm", "run_index", name="uq_replay_results_cell"),
    )
    op.create_table(
        "agent_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("attempt_id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("time", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["attempt_id"], ["attempts.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("attempt_id", "seq", name="uq_agent_events_attempt_seq"),
    )
    op.create_table(
        "requests",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("attempt_id", sa.Integer(), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("drafts", sa.Integer(), nullable=False),
        sa.Column("draft_tokens", sa.Integer(), nullable=False),
        sa.Column("accepted_tokens", sa.Integer(), nullable=False),
        sa.Column("accepted_per_position", sa.JSON(), nullable=False),
        sa.Column("spans", sa.JSON(), nullable=False),
        sa.Column("timings", sa.JSON(), nullable=False),
        sa.Column("decode_seconds", sa.Float(), nullable=True),
        sa.Column("prompt_token_ids", sa.JSON(), nullable=False),
        sa.Column("sampling_params", sa.JSON(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("finish_reason", sa.String(length=32), nullable=True),
        sa.Column("created", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["attempt_id"], ["attempts.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("attempt_id", "index", name="uq_requests_attempt_index"),
    )


def downgrade() -> None:

    op.drop_table("requests")
    op.drop_table("agent_events")
    op.drop_table("replay_results")
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_attempts_task_id"))
        batch_op.drop_index("ix_attempts_claim")
        batch_op.drop_index(batch_op.f("ix_attempts_arm_id"))

    op.drop_table("attempts")
    op.drop_table("replay_runs")
    with op.batch_alter_table("arms", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_arms_sweep_id"))

    op.drop_table("arms")
    op.drop_table("tasks")
    op.drop_table("sweeps")

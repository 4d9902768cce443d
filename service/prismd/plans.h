/* Hybrid-device compute plans of one job (DESIGN 11, issue 15 item 3), owned by the policy
 * thread with the job. Keeps the planner's inputs per block (the layout's cost figures, the
 * latest weight and activation statistics of any rank, the gradient statistics of the last
 * decision), groups the ranks by device class, and at each decision plans with
 * prism_hybrid_plan (service/policy/hybrid.h) unless the raise ranking and the inputs are those
 * of the last plan made. The plan in force is what every map carries to the agents of each class,
 * what the store keeps with the map it went out with, and what GET /v1/jobs/{job}/plan shows. */
#ifndef PRISMD_PLANS_H
#define PRISMD_PLANS_H

#include "config.h"
#include "policy.h"
#include "snapshot.h"

typedef struct prismd_plans prismd_plans;

/* The outcome of planning at one decision. */
typedef enum prismd_plan_outcome {
    PRISMD_PLAN_NONE = 0,   /* nothing to plan: disabled, one class, statistics missing */
    PRISMD_PLAN_KEPT,       /* the ranking and inputs are those of the last plan made: no re-plan */
    PRISMD_PLAN_PLANNED,    /* a new plan is in force */
    PRISMD_PLAN_REFUSED,    /* the plan in force stays; the message says why */
    PRISMD_PLAN_WITHDRAWN   /* hybrid turned off: the plan in force is dropped */
} prismd_plan_outcome;

/* max_pairs: the most (class, block) pairs of non-fixed classes one plan may have
 * (--hybrid-max-pairs); max_classes: the most device classes (--hybrid-max-classes). More is
 * refused (the plan in force stays; the message names the flag), and so are C classes x L blocks
 * above max_classes x max_pairs (what one attempt allocates is bounded by it), checked before
 * anything is allocated. An allocation that fails is a refusal ("out of memory ..."). */
prismd_plans *prismd_plans_create(size_t max_pairs, size_t max_classes);
void prismd_plans_destroy(prismd_plans *p);

/* A layout block's cost figures (the latest Hello's win). A block whose figures are all 0 (flops,
 * activation and state bytes) is not added: a job whose trainers send no cost figures or tensor
 * statistics holds no per-block planner state. false: out of memory. */
bool prismd_plans_layout(prismd_plans *p, uint32_t id, double param_bytes, double flops, double activation_bytes,
                         double state_bytes);

/* A Hello changed a rank's device class (or gave a rank its first): the class list is rebuilt
 * when next needed, O(R log R); otherwise it is kept. */
void prismd_plans_classes_changed(prismd_plans *p);

/* One validated BlockTensorStats entry of rank's report of step: each half (x_numel >= 1: the
 * activation half, w_numel >= 1: the weight half) replaces the block's when its step is later, or
 * the same step from a lower rank. false: out of memory. */
bool prismd_plans_tensor_stats(prismd_plans *p, uint32_t rank, uint64_t step, uint32_t id, double x_l2,
                               double x_max_abs, double x_numel, double w_l2, double w_max_abs, double w_numel,
                               double y_numel);

/* The merged step of a decision: each block's l2_norm and max_abs become its gradient
 * statistics (non-finite ones are left out: the block keeps its previous ones). Only blocks
 * already known (from cost figures or tensor statistics) are updated. */
bool prismd_plans_gradients(prismd_plans *p, const prism_block_stats *blocks, size_t count);

/* Plans at a decision with the config in force and the job's ranks (ascending; those that sent
 * a Hello since prismd started, world_size at most). The plan in force is withdrawn for fewer
 * than two classes only when all world_size ranks have sent one (after a restart ranks come back
 * one by one). *low_sets_changed
 * is true when the per-class low sets now in force differ from those before (the map must go
 * out: the caller commits one and calls prismd_plans_set_map). Logs refusals. */
prismd_plan_outcome prismd_plans_decide(prismd_plans *p, const char *job_id, const prism_config *cfg,
                                        const prismd_rank_facts *ranks, size_t nranks, uint32_t world_size,
                                        bool *low_sets_changed);

/* The map the plan now in force went out with. */
void prismd_plans_set_map(prismd_plans *p, uint64_t map_version, uint64_t decided_step, uint64_t effective_step);

/* Whether the row (plan, its map, status, message) changed since the store last took it: a
 * planned, refused or withdrawn outcome, or a new map. The caller passes the row with every
 * state it saves while this holds, and calls prismd_plans_saved after a save that succeeded. */
bool prismd_plans_row_dirty(const prismd_plans *p);
/* The store holds the row now: the plan in force becomes the durable one Welcome carries. */
void prismd_plans_saved(prismd_plans *p);
/* The last durable plan's class named device_class (what a Welcome carries: a plan is durable
 * before it is sent, DESIGN 7), or NULL; *iteration_seconds its T. */
const prismd_plan_class *prismd_plans_durable_class(const prismd_plans *p, const char *device_class,
                                                    double *iteration_seconds);

/* The plan in force's class named device_class, or NULL (no plan, or none for that class). */
const prismd_plan_class *prismd_plans_class(const prismd_plans *p, const char *device_class);
/* The plan in force's predicted iteration time T. */
double prismd_plans_iteration_seconds(const prismd_plans *p);
size_t prismd_plans_class_count(const prismd_plans *p);
const prismd_plan_class *prismd_plans_class_at(const prismd_plans *p, size_t i);

/* The plan state as the store keeps it; valid until the next call on p. */
void prismd_plans_row(const prismd_plans *p, prismd_plan_row *out);

/* Puts a stored row back (restart): the plan in force (and durable) is read from its JSON. With
 * hybrid false (the loaded config's) a stored plan is not put in force: the next decision
 * withdraws it with a map of its own, since agents may still hold it. false: the JSON is not a
 * plan object (err says why). */
bool prismd_plans_restore(prismd_plans *p, const prismd_plan_row *row, bool hybrid, prism_error *err);

/* Fills *out (to be freed with prismd_plan_view_free) with the state REST shows, the status
 * judged now from cfg and ranks. false: out of memory. */
bool prismd_plans_view(prismd_plans *p, const prism_config *cfg, const prismd_rank_facts *ranks, size_t nranks,
                       prismd_plan_view *out);

#endif

/* Result JSON writers (docs/design.md, engine: result and exit codes). Key order is fixed; see docs/engine.md for the fields. */
#include "result.h"

#include <stdarg.h>
#include <string.h>

#include "config.h"
#include "json.h"
#include "kernels.h"
#include "model.h"

const char *err_kind_for_code(int code) {
    switch (code) {
    case 2: return "config";
    case 3: return "model";
    case 4: return "io";
    default: return "internal";
    }
}

int err_set(bmoe_error *e, int code, const char *kind, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    for (char *p = e->msg; *p; p++) /* the error is one line, whatever a path or value contained */
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
    e->code = code;
    e->kind = kind ? kind : err_kind_for_code(code);
    return code;
}

/* The model facts shared by `run` (under "model") and `info` (top level). top_k_effective < 0: not
 * written. */
static void model_fields(json_writer *w, const bmoe_model *m, int top_k_effective) {
    const bmoe_hparams *hp = &m->hp;
    json_str(w, "path", m->path);
    json_str(w, "arch", m->arch);
    json_int(w, "layers", hp->n_layer);
    json_int(w, "n_embd", hp->n_embd);
    json_int(w, "n_vocab", hp->n_vocab);
    json_int(w, "n_expert", hp->n_expert);
    json_int(w, "top_k", hp->n_expert_used);
    if (top_k_effective >= 0) json_int(w, "top_k_effective", top_k_effective);
    json_begin_array(w, "moe_layers");
    for (int i = 0; i < m->n_moe_layers; i++) json_int(w, NULL, m->moe_layers[i]);
    json_end_array(w);
    /* one expert of each MoE layer (moe_layers' order), its parts in their own types */
    json_begin_array(w, "expert_bytes_per_layer");
    for (int i = 0; i < m->n_moe_layers; i++) json_uint(w, NULL, m->layers[m->moe_layers[i]].expert_bytes);
    json_end_array(w);
    json_begin_array(w, "shards");
    for (uint32_t s = 0; s < m->g->n_shards; s++) json_str(w, NULL, m->g->shards[s].path);
    json_end_array(w);
    json_begin_object(w, "gating");
    json_str(w, "func", hp->gating->name);
    json_bool(w, "norm", hp->norm_w);
    json_num(w, "scale", hp->w_scale);
    json_end_object(w);
    json_uint(w, "tensors", m->g->n_tensors);
    json_uint(w, "file_bytes", m->file_bytes);
}

static void write_model(json_writer *w, const char *key, const bmoe_model *m, int top_k_effective) {
    json_begin_object(w, key);
    model_fields(w, m, top_k_effective);
    json_end_object(w);
}

void result_write_counters(json_writer *w, const char *key, const bmoe_counters *c) {
    json_begin_object(w, key);
    json_uint(w, "experts_routed", c->experts_routed);
    json_uint(w, "experts_dropped", c->experts_dropped);
    json_uint(w, "subst_examined", c->subst_examined);
    json_uint(w, "subst_changed", c->subst_changed);
    json_uint(w, "cache_hits", c->cache_hits);
    json_uint(w, "cache_misses", c->cache_misses);
    json_uint(w, "flash_bytes", c->flash_bytes);
    json_uint(w, "flash_reads", c->flash_reads);
    json_uint(w, "prefetch_issued", c->prefetch_issued);
    json_uint(w, "prefetch_used", c->prefetch_used);
    json_num(w, "weight_routed", c->weight_routed);
    json_num(w, "weight_dropped", c->weight_dropped);
    json_end_object(w);
}

/* What the expert reads cost in file bytes: a measurement of the I/O path (direct reads add their
 * alignment padding, buffered ones do not), not a decision, so it is kept out of "counters", which
 * every device must agree on. */
static void write_io(json_writer *w, const bmoe_counters *c) {
    json_begin_object(w, "io");
    json_uint(w, "flash_read_bytes", c->flash_read_bytes);
    json_num(w, "read_amplification", c->flash_bytes ? (double)c->flash_read_bytes / (double)c->flash_bytes : 0.0);
    json_end_object(w);
}

/* flash_reads and flash_bytes per MoE layer (zeros when nothing streams): what the counters sum. */
static void write_flash_layers(json_writer *w, const bmoe_result *r) {
    const bmoe_model *m = r->model;
    json_begin_array(w, "flash_by_layer");
    for (int i = 0; i < m->n_moe_layers; i++) {
        int have = r->flash_layer_reads && i < r->n_flash_layers;
        json_begin_object(w, NULL);
        json_int(w, "layer", m->moe_layers[i]);
        json_uint(w, "flash_reads", have ? r->flash_layer_reads[i] : 0);
        json_uint(w, "flash_bytes", have ? r->flash_layer_bytes[i] : 0);
        json_end_object(w);
    }
    json_end_array(w);
}

void result_write_run(FILE *out, int with_id, const char *id, const bmoe_result *r) {
    json_writer w;
    json_init(&w, out);
    json_begin_object(&w, NULL);
    if (with_id) json_str(&w, "id", id); /* NULL → null */
    json_bool(&w, "ok", 1);
    json_str(&w, "version", BMOE_VERSION);
    json_str(&w, "build_id", BMOE_BUILD_ID);
    json_str(&w, "target", BMOE_TARGET);
    json_str(&w, "kernels", r->kernels ? r->kernels : "unknown");
    config_to_json(r->config, &w, "config");
    write_model(&w, "model", r->model, r->top_k_effective);
    json_begin_array(&w, "prompt_tokens");
    for (int i = 0; i < r->n_prompt_tokens; i++) json_int(&w, NULL, r->prompt_tokens[i]);
    json_end_array(&w);
    json_begin_array(&w, "tokens");
    for (int i = 0; i < r->n_tokens; i++) json_int(&w, NULL, r->tokens[i]);
    json_end_array(&w);
    json_str(&w, "stop", r->stop);
    json_strn(&w, "text", (const char *)r->text, r->text_len);
    json_hex(&w, "text_hex", r->text, r->text_len);
    if (r->write_extra) r->write_extra(&w, r->extra_user);
    result_write_counters(&w, "counters", &r->counters);
    write_flash_layers(&w, r);
    write_io(&w, &r->counters);
    json_begin_object(&w, "timing");
    json_num(&w, "load_s", r->timing.load_s);
    json_num(&w, "prefill_s", r->timing.prefill_s);
    json_num(&w, "decode_s", r->timing.decode_s);
    json_num(&w, "decode_tok_s", r->timing.decode_tok_s);
    json_begin_array(&w, "decode_step_s");
    for (int i = 0; i < r->n_decode_steps; i++) json_num(&w, NULL, r->decode_step_s[i]);
    json_end_array(&w);
    json_end_object(&w);
    json_begin_array(&w, "warnings");
    for (int i = 0; i < r->n_warnings; i++) json_str(&w, NULL, r->warnings[i]);
    json_end_array(&w);
    json_end_object(&w);
    json_end(&w);
}

void result_write_error(FILE *out, int with_id, const char *id, const bmoe_error *e) {
    json_writer w;
    json_init(&w, out);
    json_begin_object(&w, NULL);
    if (with_id) json_str(&w, "id", id); /* NULL → null */
    json_bool(&w, "ok", 0);
    json_begin_object(&w, "error");
    json_str(&w, "kind", e->kind ? e->kind : err_kind_for_code(e->code));
    json_str(&w, "message", e->msg);
    json_end_object(&w);
    json_end_object(&w);
    json_end(&w);
}

void result_write_check_ok(FILE *out, int with_id, const char *id) {
    json_writer w;
    json_init(&w, out);
    json_begin_object(&w, NULL);
    if (with_id) json_str(&w, "id", id); /* NULL → null */
    json_bool(&w, "ok", 1);
    json_end_object(&w);
    json_end(&w);
}

/* One type's facts from the table (type_traits.h), the keys `info` and `info --types` share. */
static void type_fields(json_writer *w, uint32_t id, const bm_type_traits *tt) {
    json_str(w, "type", tt->name);
    json_uint(w, "id", id);
    json_uint(w, "block_values", tt->blck);
    json_uint(w, "block_bytes", tt->bytes);
    json_str(w, "activation", bm_act_name(tt->act));
}

void result_write_types(FILE *out) {
    json_writer w;
    json_init(&w, out);
    json_begin_object(&w, NULL);
    json_bool(&w, "ok", 1);
    /* what this CPU runs (a farm's preflight checks a device's pinned path here: no model needed) */
    json_str(&w, "kernels", bm_kpath_name(bm_kpath_best()));
    json_begin_array(&w, "kernels_available");
    for (int p = 0; p < BM_KPATH_COUNT; p++)
        if (bm_kpath_available((bm_kpath)p)) json_str(&w, NULL, bm_kpath_name((bm_kpath)p));
    json_end_array(&w);
    json_begin_array(&w, "weight_types");
    for (uint32_t id = 0; id < GGML_TYPE_COUNT; id++) {
        const bm_type_traits *tt = bm_type(id);
        if (!tt) continue;
        json_begin_object(&w, NULL);
        type_fields(&w, id, tt);
        json_begin_array(&w, "checked");
        for (int f = 0; f < BM_TYPE_FIELDS && tt->fields[f].fmt; f++) json_str(&w, NULL, tt->fields[f].name);
        json_end_array(&w);
        json_begin_array(&w, "kernels"); /* the paths this binary has a kernel of the type for */
        for (int p = 0; p < BM_KPATH_COUNT; p++)
            if (tt->dot[p] && tt->dot_mt[p]) json_str(&w, NULL, bm_kpath_name((bm_kpath)p));
        json_end_array(&w);
        json_end_object(&w);
    }
    json_end_array(&w);
    json_end_object(&w);
    json_end(&w);
}

void result_write_info(FILE *out, const bmoe_model *m) {
    json_writer w;
    json_init(&w, out);
    json_begin_object(&w, NULL);
    json_bool(&w, "ok", 1);
    json_str(&w, "version", BMOE_VERSION);
    json_str(&w, "build_id", BMOE_BUILD_ID);
    json_str(&w, "target", BMOE_TARGET);
    json_str(&w, "kernels", bm_kpath_name(bm_kpath_best())); /* what a run picks by default here */
    json_begin_array(&w, "kernels_available");
    for (int p = 0; p < BM_KPATH_COUNT; p++)
        if (bm_kpath_available((bm_kpath)p)) json_str(&w, NULL, bm_kpath_name((bm_kpath)p));
    json_end_array(&w);
    model_fields(&w, m, -1);
    /* the file's weight types, as the type table describes them (type_traits.h), in id order */
    json_begin_array(&w, "weight_types");
    for (uint32_t id = 0; id < GGML_TYPE_COUNT; id++) {
        uint64_t n = 0, bytes = 0;
        for (uint64_t i = 0; i < m->g->n_tensors; i++)
            if (m->g->tensors[i].type == id) { n++; bytes += m->g->tensors[i].nbytes; }
        const bm_type_traits *tt = bm_type(id);
        if (!n || !tt) continue;
        json_begin_object(&w, NULL);
        type_fields(&w, id, tt);
        json_uint(&w, "tensors", n);
        json_uint(&w, "bytes", bytes);
        json_end_object(&w);
    }
    json_end_array(&w);
    /* where each expert lives: what a streamer reads (expert e at offset + e * stride) */
    json_begin_array(&w, "expert_layout");
    for (int i = 0; i < m->n_moe_layers; i++) {
        const bmoe_layer *ly = &m->layers[m->moe_layers[i]];
        json_begin_object(&w, NULL);
        json_int(&w, "layer", m->moe_layers[i]);
        json_uint(&w, "expert_bytes", ly->expert_bytes);
        json_begin_array(&w, "tensors");
        for (int p = 0; p < BMOE_EXP_NPARTS; p++) {
            const bmoe_expert_part *ep = &ly->exp_part[p];
            if (!ep->present) continue;
            json_begin_object(&w, NULL);
            json_str(&w, "name", ep->name);
            json_str(&w, "type", bm_type_name(ep->type));
            json_uint(&w, "shard", ep->shard);
            json_uint(&w, "offset", ep->offset);
            json_uint(&w, "stride", ep->stride);
            json_uint(&w, "bytes", ep->bytes);
            json_end_object(&w);
        }
        json_end_array(&w);
        json_end_object(&w);
    }
    json_end_array(&w);
    json_end_object(&w);
    json_end(&w);
}

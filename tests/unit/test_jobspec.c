/* Unit tests of api/jobspec: a table of good and bad specs with the expected
 * status, code, field and a fragment of the message; canonical round trips;
 * defaults and derived numbers; data-path confinement on a temporary tree
 * with symlinks pointing outside. Specs are written with single quotes for
 * readability and turned into JSON before parsing. */
#include "api/jobspec.h"
#include "tests/check.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define G2  "'model':{'family':'gpt2','preset':'124m'}"
#define DT  "'data':{'train':'/data/fw/train_*.bin'}"
#define MIN G2 "," DT
/* docs/architecture.md "Fine-tuning contract", every field set */
#define FT_EXAMPLE                                                                                 \
    "{'model':{'family':'llama','preset':'1b','init_from':'/data/models/Llama-3.2-1B'},"           \
    "'data':{'train':'/data/chat/*.jsonl','format':'chat','tokenizer':'/data/models/"              \
    "Llama-3.2-1B',"                                                                               \
    "'chat_template':'llama3','text_key':'text','val_fraction':0.01,'overlong':'truncate'},"       \
    "'train':{'loss_on':'assistant','packing':'document','lora':{'rank':16,'alpha':32,"            \
    "'dropout':0.0,'targets':['q','k','v','o','gate','up','down']},'quantize_base':'nf4',"         \
    "'precision':'bf16','recompute':{'budget_gib':20},'micro_batch':1},"                           \
    "'export':{'hf':true,'lora':true},"                                                            \
    "'resources':{'device':'cuda','gpu_type':'H100-SXM','gpus_per_node':8,'allow_mixed':false,"    \
    "'pool':'train','labels':{'zone':'eu'}},"                                                      \
    "'max_runtime_s':86400,'after':['j-d1b9522f5b1a'],'preemptible':true,"                         \
    "'array':{'train.lr':[1e-4,3e-4]}}"

struct tcase {
    const char *what;
    const char *spec; /* single-quoted JSON */
    unsigned flags;
    int status;        /* 0: valid */
    const char *code;  /* expected code */
    const char *field; /* expected field path */
    const char *msg;   /* substring the message must contain (may be NULL) */
};

static const struct tcase cases[] = {
    /* ---- valid ---- */
    {"minimal", "{" MIN "}", 0, 0, NULL, NULL, NULL},
    {"architecture example",
     "{'name':'gpt2-small','labels':{'team':'nlp'}," G2 ","
     "'data':{'train':'/data/fineweb/train_*.bin','val':'/data/fineweb/val_000.bin'},"
     "'parallel':{'dp':2,'tp':1,'pp':1,'zero_stage':1},"
     "'train':{'steps':1000,'global_batch_tokens':524288,'micro_batch':16,'lr':6e-4,"
     "'min_lr':6e-5,'warmup_steps':100,'schedule':'cosine','weight_decay':0.1,'grad_clip':1.0,"
     "'seed':42,'precision':'bf16','recompute':'none','offload_optimizer':false},"
     "'checkpoint':{'every_steps':200,'keep':3},'resources':{'device':'cuda','gpus_per_node':8},"
     "'priority':50,'max_retries':3}",
     0, 0, NULL, NULL, NULL},
    {"llama 70b tp8 pp4 dp2",
     "{'model':{'family':'llama','preset':'70b'}," DT ",'parallel':{'dp':2,'tp':8,'pp':4},"
     "'train':{'micro_batch':1,'global_batch_tokens':262144,'offload_optimizer':true}}",
     0, 0, NULL, NULL, NULL},
    {"explicit sizes",
     "{'model':{'family':'llama','n_layer':4,'n_head':8,'n_kv_head':2,'d_model':256,"
     "'vocab_size':1000,'seq_len':128,'rope_theta':500000}," DT "}",
     0, 0, NULL, NULL, NULL},
    {"cpu tiny defaults to fp32",
     "{'model':{'family':'gpt2','preset':'tiny'}," DT ",'resources':{'device':'cpu'},"
     "'parallel':{'dp':2,'tp':2,'pp':2},'train':{'global_batch_tokens':2048,'micro_batch':4}}",
     0, 0, NULL, NULL, NULL},
    {"plan needs no data", "{" G2 "}", JOBSPEC_FOR_PLAN, 0, NULL, NULL, NULL},
    {"preset with overrides",
     "{'model':{'family':'gpt2','preset':'124m','n_layer':8,'seq_len':512}," DT
     ",'parallel':{'pp':4},'train':{'micro_batch':2,'global_batch_tokens':4096}}",
     0, 0, NULL, NULL, NULL},
    {"labels and eval",
     "{" G2 ",'data':{'train':'/d/t.bin','val':'/d/v.bin'},'labels':{'b':'2','a':'1',"
     "'team/x.y-z':''},'train':{'eval_every':50,'eval_batches':5}}",
     0, 0, NULL, NULL, NULL},
    /* ---- shape and type ---- */
    {"not an object", "['x']", 0, 400, "INVALID_JSON", "", "array"},
    {"unknown top field", "{" MIN ",'nmae':'x'}", 0, 422, "UNKNOWN_FIELD", "nmae", "nmae"},
    {"unknown train field", "{" MIN ",'train':{'lrr':1}}", 0, 422, "UNKNOWN_FIELD", "train.lrr",
     "did you mean train.lr (peak learning rate)?"},
    {"typo in a lora key", "{" MIN ",'train':{'lora':{'rnak':4}}}", 0, 422, "UNKNOWN_FIELD",
     "train.lora.rnak", "did you mean train.lora.rank"},
    {"no near name", "{" MIN ",'train':{'zzzzzz':1}}", 0, 422, "UNKNOWN_FIELD", "train.zzzzzz",
     "unknown field train.zzzzzz"},
    {"unknown model field", "{'model':{'family':'gpt2','layers':3}," DT "}", 0, 422,
     "UNKNOWN_FIELD", "model.layers", NULL},
    {"lr as string", "{" MIN ",'train':{'lr':'0.1'}}", 0, 422, "WRONG_TYPE", "train.lr", "string"},
    {"steps with fraction", "{" MIN ",'train':{'steps':10.5}}", 0, 422, "WRONG_TYPE", "train.steps",
     "integer"},
    {"bool as string", "{" MIN ",'train':{'offload_optimizer':'yes'}}", 0, 422, "WRONG_TYPE",
     "train.offload_optimizer", NULL},
    {"train not an object", "{" MIN ",'train':[1]}", 0, 422, "WRONG_TYPE", "train", "array"},
    {"null value", "{" G2 ",'data':{'train':'/a.bin','val':null}}", 0, 422, "WRONG_TYPE",
     "data.val", "null"},
    {"labels as array", "{" MIN ",'labels':['a']}", 0, 422, "WRONG_TYPE", "labels", NULL},
    {"label value number", "{" MIN ",'labels':{'team':3}}", 0, 422, "WRONG_TYPE", "labels.team",
     NULL},
    /* ---- ranges and enums ---- */
    {"zero steps", "{" MIN ",'train':{'steps':0}}", 0, 422, "OUT_OF_RANGE", "train.steps",
     "steps=0"},
    {"negative micro_batch", "{" MIN ",'train':{'micro_batch':-4}}", 0, 422, "OUT_OF_RANGE",
     "train.micro_batch", "-4"},
    {"zero lr", "{" MIN ",'train':{'lr':0}}", 0, 422, "OUT_OF_RANGE", "train.lr", NULL},
    {"zero_stage 4", "{" MIN ",'parallel':{'zero_stage':4}}", 0, 422, "OUT_OF_RANGE",
     "parallel.zero_stage", NULL},
    {"dp 0", "{" MIN ",'parallel':{'dp':0}}", 0, 422, "OUT_OF_RANGE", "parallel.dp", NULL},
    {"priority 101", "{" MIN ",'priority':101}", 0, 422, "OUT_OF_RANGE", "priority", "101"},
    {"gpus_per_node 0", "{" MIN ",'resources':{'gpus_per_node':0}}", 0, 422, "OUT_OF_RANGE",
     "resources.gpus_per_node", NULL},
    {"negative seed", "{" MIN ",'train':{'seed':-1}}", 0, 422, "OUT_OF_RANGE", "train.seed", NULL},
    {"huge steps", "{" MIN ",'train':{'steps':1000000000000}}", 0, 422, "OUT_OF_RANGE",
     "train.steps", NULL},
    {"seq_len 0", "{'model':{'family':'gpt2','preset':'124m','seq_len':0}," DT "}", 0, 422,
     "OUT_OF_RANGE", "model.seq_len", NULL},
    {"negative n_head",
     "{'model':{'family':'gpt2','n_layer':2,'n_head':-1,'d_model':64,'vocab_size':10,"
     "'seq_len':8}," DT "}",
     0, 422, "OUT_OF_RANGE", "model.n_head", NULL},
    {"schedule step", "{" MIN ",'train':{'schedule':'step'}}", 0, 422, "INVALID_VALUE",
     "train.schedule", "cosine|linear|constant"},
    {"device tpu", "{" MIN ",'resources':{'device':'tpu'}}", 0, 422, "INVALID_VALUE",
     "resources.device", "tpu"},
    {"family bert", "{'model':{'family':'bert'}," DT "}", 0, 422, "INVALID_VALUE", "model.family",
     NULL},
    {"name too long",
     "{" MIN ",'name':'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'}", 0,
     422, "OUT_OF_RANGE", "name", "at most 63"},
    {"control char in name", "{" MIN ",'name':'a\\u0001b'}", 0, 422, "INVALID_VALUE", "name",
     "control"},
    {"NUL in data path", "{" G2 ",'data':{'train':'/a\\u0000/etc/passwd'}}", 0, 400, "INVALID_JSON",
     "", NULL},
    {"rope_theta on gpt2", "{'model':{'family':'gpt2','preset':'124m','rope_theta':1e4}," DT "}", 0,
     422, "INVALID_VALUE", "model.rope_theta", NULL},
    /* ---- required ---- */
    {"missing model", "{" DT "}", 0, 422, "MISSING_FIELD", "model", NULL},
    {"missing family", "{'model':{'preset':'124m'}," DT "}", 0, 422, "MISSING_FIELD",
     "model.family", NULL},
    {"missing data.train", "{" G2 "}", 0, 422, "MISSING_FIELD", "data.train", NULL},
    {"no preset, no n_head",
     "{'model':{'family':'gpt2','n_layer':2,'d_model':64,'vocab_size':10,'seq_len':8}," DT "}", 0,
     422, "MISSING_FIELD", "model.n_head", NULL},
    {"unknown preset", "{'model':{'family':'gpt2','preset':'125m'}," DT "}", 0, 422,
     "UNKNOWN_PRESET", "model.preset", "124m"},
    {"llama preset under gpt2", "{'model':{'family':'gpt2','preset':'70b'}," DT "}", 0, 422,
     "UNKNOWN_PRESET", "model.preset", NULL},
    /* ---- model rules ---- */
    {"heads do not divide d_model",
     "{'model':{'family':'gpt2','n_layer':2,'n_head':5,'d_model':64,'vocab_size':10,"
     "'seq_len':8}," DT "}",
     0, 422, "INVALID_MODEL", "model.n_head", "n_head=5"},
    {"kv heads do not divide heads",
     "{'model':{'family':'llama','preset':'7b','n_kv_head':5}," DT "}", 0, 422, "INVALID_MODEL",
     "model.n_kv_head", "n_kv_head=5"},
    {"gqa on gpt2", "{'model':{'family':'gpt2','preset':'124m','n_kv_head':4}," DT "}", 0, 422,
     "INVALID_MODEL", "model.n_kv_head", NULL},
    /* ---- layout rules ---- */
    {"tp does not divide heads", "{" MIN ",'parallel':{'tp':5}}", 0, 422, "TP_HEADS", "parallel.tp",
     "tp=5 does not divide n_head=12"},
    {"tp does not divide kv heads",
     "{'model':{'family':'llama','preset':'70b'}," DT ",'parallel':{'tp':16},"
     "'resources':{'gpus_per_node':16}}",
     0, 422, "TP_KV_HEADS", "parallel.tp", "n_kv_head=8"},
    {"tp does not divide d_ff",
     "{'model':{'family':'gpt2','preset':'350m','d_ff':3004}," DT ",'parallel':{'tp':8}}", 0, 422,
     "TP_FFN", "parallel.tp", "d_ff=3004"},
    {"tp crosses node", "{'model':{'family':'gpt2','preset':'350m'}," DT ",'parallel':{'tp':16}}",
     0, 422, "TP_CROSSES_NODE", "parallel.tp", "gpus_per_node=8"},
    {"pp does not divide layers", "{" MIN ",'parallel':{'pp':5}}", 0, 422, "PP_LAYERS",
     "parallel.pp", "pp=5 does not divide n_layer=12"},
    {"pp_balance splits layers unevenly",
     "{" MIN ",'parallel':{'pp':5,'pp_balance':true},'train':{'global_batch_tokens':20480}}", 0, 0,
     NULL, NULL, NULL},
    {"pp above the layers", "{" MIN ",'parallel':{'pp':13,'pp_balance':true}}", 0, 422, "PP_LAYERS",
     "parallel.pp", "pp=13 exceeds n_layer=12"},
    {"pp_balance not a bool", "{" MIN ",'parallel':{'pp':2,'pp_balance':1}}", 0, 422, "WRONG_TYPE",
     "parallel.pp_balance", "true or false"},
    {"world too large", "{" MIN ",'parallel':{'dp':16384,'tp':2}}", 0, 422, "WORLD_TOO_LARGE",
     "parallel", "32768"},
    {"zero 3 with pp",
     "{" MIN ",'parallel':{'pp':2,'zero_stage':3},'train':{'micro_batch':1,"
     "'global_batch_tokens':4096}}",
     0, 422, "ZERO_WITH_PP", "parallel.zero_stage", NULL},
    /* ---- batch and optimizer rules ---- */
    {"batch not divisible",
     "{" MIN ",'parallel':{'dp':2},'train':{'micro_batch':16,'global_batch_tokens':1000}}", 0, 422,
     "BATCH_NOT_DIVISIBLE", "train.global_batch_tokens", "16*1024*2 = 32768"},
    {"1F1B needs micro-batches",
     "{" MIN ",'parallel':{'pp':4},'train':{'micro_batch':1,'global_batch_tokens':2048}}", 0, 422,
     "PP_TOO_FEW_MICROBATCHES", "train.global_batch_tokens", "pp=4"},
    {"min_lr above lr", "{" MIN ",'train':{'lr':1e-4,'min_lr':1e-3}}", 0, 422, "LR_ORDER",
     "train.min_lr", NULL},
    {"warmup longer than run", "{" MIN ",'train':{'steps':10,'warmup_steps':11}}", 0, 422,
     "WARMUP_TOO_LONG", "train.warmup_steps", "warmup_steps=11"},
    {"bf16 on cpu", "{" MIN ",'resources':{'device':'cpu'},'train':{'precision':'bf16'}}", 0, 422,
     "PRECISION_DEVICE", "train.precision", NULL},
    {"offload on cpu", "{" MIN ",'resources':{'device':'cpu'},'train':{'offload_optimizer':true}}",
     0, 422, "OFFLOAD_DEVICE", "train.offload_optimizer", NULL},
    {"eval without val", "{" MIN ",'train':{'eval_every':10}}", 0, 422, "EVAL_WITHOUT_VAL",
     "train.eval_every", NULL},
    /* ---- data paths (lexical) ---- */
    {"relative path", "{" G2 ",'data':{'train':'data/t.bin'}}", 0, 422, "DATA_PATH_INVALID",
     "data.train", "absolute"},
    {"dot-dot escape", "{" G2 ",'data':{'train':'/data/../etc/passwd'}}", 0, 422,
     "DATA_PATH_INVALID", "data.train", "'..'"},
    {"glob in directory", "{" G2 ",'data':{'train':'/data/*/t.bin'}}", 0, 422, "DATA_PATH_INVALID",
     "data.train", "glob"},
    {"directory as val", "{" G2 ",'data':{'train':'/d/t.bin','val':'/d/'}}", 0, 422,
     "DATA_PATH_INVALID", "data.val", NULL},
    {"relative path in plan too", "{" G2 ",'data':{'train':'x.bin'}}", JOBSPEC_FOR_PLAN, 422,
     "DATA_PATH_INVALID", "data.train", NULL},
    /* ---- name and labels ---- */
    {"name with space", "{" MIN ",'name':'my job'}", 0, 422, "INVALID_NAME", "name", NULL},
    {"empty name", "{" MIN ",'name':''}", 0, 422, "INVALID_NAME", "name", NULL},
    {"bad label key", "{" MIN ",'labels':{'te am':'x'}}", 0, 422, "INVALID_LABEL", "labels.te am",
     NULL},
    {"sql-looking name", "{" MIN ",'name':'x\\u0027; DROP TABLE jobs;--'}", 0, 422, "INVALID_NAME",
     "name", NULL},
    /* ---- fine-tuning contract: valid ---- */
    {"fine-tuning contract example", FT_EXAMPLE, 0, 0, NULL, NULL, NULL},
    {"init_from a job step, text with the job's tokenizer",
     "{'model':{'family':'gpt2','preset':'124m','init_from':'job:j-d1b9522f5b1a@200'},"
     "'data':{'train':'/d/*.txt','format':'text'}}",
     0, 0, NULL, NULL, NULL},
    {"init_from a job", "{'model':{'family':'gpt2','preset':'124m','init_from':'job:j-1'}," DT "}",
     0, 0, NULL, NULL, NULL},
    {"gpu_type list, fp8, recompute budget",
     "{" MIN ",'resources':{'gpu_type':['H100-SXM','H200'],'allow_mixed':true},"
     "'train':{'precision':'fp8','recompute':{'budget_gib':12.5}}}",
     0, 0, NULL, NULL, NULL},
    {"gpt2 lora targets, any order",
     "{" MIN ",'train':{'lora':{'rank':4,'targets':['fc2','attn']}},'export':{'lora':true}}", 0, 0,
     NULL, NULL, NULL},
    {"eval from val_fraction",
     "{" G2 ",'data':{'train':'/d/a.jsonl','format':'jsonl','tokenizer':'/m/tokenizer.json',"
     "'text_key':'body','val_fraction':0.5,'overlong':'drop'},'train':{'eval_every':10}}",
     0, 0, NULL, NULL, NULL},
    {"array over two keys", "{" MIN ",'array':{'train.seed':[1,2,3],'parallel.dp':[1,2]}}",
     JOBSPEC_ARRAY_MEMBERS, 0, NULL, NULL, NULL},
    {"completion loss",
     "{" G2 ",'data':{'train':'/d/c.jsonl','format':'completion',"
     "'tokenizer':'/m'},'train':{'loss_on':'completion','packing':'document'}}",
     0, 0, NULL, NULL, NULL},
    {"plan needs no tokenizer", "{" G2 ",'data':{'format':'chat'}}", JOBSPEC_FOR_PLAN, 0, NULL,
     NULL, NULL},
    /* ---- fine-tuning contract: bad values ---- */
    {"init_from relative",
     "{'model':{'family':'gpt2','preset':'124m','init_from':'models/x'}," DT "}", 0, 422,
     "INVALID_INIT_FROM", "model.init_from", "models/x"},
    {"init_from dot-dot",
     "{'model':{'family':'gpt2','preset':'124m','init_from':'/m/../x'}," DT "}", 0, 422,
     "INVALID_INIT_FROM", "model.init_from", "/m/../x"},
    {"init_from job without id",
     "{'model':{'family':'gpt2','preset':'124m','init_from':'job:'}," DT "}", 0, 422,
     "INVALID_INIT_FROM", "model.init_from", "job:"},
    {"init_from job step not a number",
     "{'model':{'family':'gpt2','preset':'124m','init_from':'job:j-1@last'}," DT "}", 0, 422,
     "INVALID_INIT_FROM", "model.init_from", "job:j-1@last"},
    {"init_from job id with space",
     "{'model':{'family':'gpt2','preset':'124m','init_from':'job:j 1'}," DT "}", 0, 422,
     "INVALID_INIT_FROM", "model.init_from", NULL},
    {"init_from number", "{'model':{'family':'gpt2','preset':'124m','init_from':3}," DT "}", 0, 422,
     "WRONG_TYPE", "model.init_from", NULL},
    {"format csv", "{" G2 ",'data':{'train':'/d/a.csv','format':'csv'}}", 0, 422, "INVALID_VALUE",
     "data.format", "\"csv\" is not one of bin|text|jsonl|chat|completion|webdataset"},
    {"tokenizer relative",
     "{" G2 ",'data':{'train':'/d/a.txt','format':'text',"
     "'tokenizer':'tok.json'}}",
     0, 422, "DATA_PATH_INVALID", "data.tokenizer", "tok.json"},
    {"text without tokenizer", "{" G2 ",'data':{'train':'/d/a.txt','format':'text'}}", 0, 422,
     "MISSING_FIELD", "data.tokenizer", "format=text"},
    {"chat_template alpaca", "{" G2 ",'data':{'train':'/d/a.bin','chat_template':'alpaca'}}", 0,
     422, "INVALID_VALUE", "data.chat_template", "\"alpaca\" is not one of llama3|chatml|mistral"},
    {"chat_template none is not a name",
     "{" G2 ",'data':{'train':'/d/a.bin','chat_template':'none'}}", 0, 422, "INVALID_VALUE",
     "data.chat_template", "llama3|chatml|mistral"},
    {"empty text_key", "{" G2 ",'data':{'train':'/d/a.bin','text_key':''}}", 0, 422,
     "INVALID_VALUE", "data.text_key", NULL},
    {"val_fraction 0.6", "{" G2 ",'data':{'train':'/d/a.bin','val_fraction':0.6}}", 0, 422,
     "OUT_OF_RANGE", "data.val_fraction", "0.6"},
    {"val_fraction negative", "{" G2 ",'data':{'train':'/d/a.bin','val_fraction':-0.1}}", 0, 422,
     "OUT_OF_RANGE", "data.val_fraction", "-0.1"},
    {"val_fraction and val",
     "{" G2 ",'data':{'train':'/d/a.bin','val':'/d/v.bin',"
     "'val_fraction':0.1}}",
     0, 422, "VAL_SOURCE_CONFLICT", "data.val_fraction", "0.1"},
    {"overlong wrap", "{" G2 ",'data':{'train':'/d/a.bin','overlong':'wrap'}}", 0, 422,
     "INVALID_VALUE", "data.overlong", "truncate|drop"},
    {"loss_on prompt", "{" MIN ",'train':{'loss_on':'prompt'}}", 0, 422, "INVALID_VALUE",
     "train.loss_on", "all|assistant|completion"},
    {"loss_on assistant on bin", "{" MIN ",'train':{'loss_on':'assistant'}}", 0, 422,
     "LOSS_ON_FORMAT", "train.loss_on", "data.format=chat, got data.format=bin"},
    {"packing pad", "{" MIN ",'train':{'packing':'pad'}}", 0, 422, "INVALID_VALUE", "train.packing",
     "concat|document"},
    {"lora rank 0", "{" MIN ",'train':{'lora':{'rank':0}}}", 0, 422, "OUT_OF_RANGE",
     "train.lora.rank", "rank=0"},
    {"lora alpha 0", "{" MIN ",'train':{'lora':{'alpha':0}}}", 0, 422, "OUT_OF_RANGE",
     "train.lora.alpha", "(0,"},
    {"lora dropout 1", "{" MIN ",'train':{'lora':{'dropout':1}}}", 0, 422, "OUT_OF_RANGE",
     "train.lora.dropout", "[0, 1)"},
    {"lora llama target on gpt2", "{" MIN ",'train':{'lora':{'targets':['attn','q']}}}", 0, 422,
     "INVALID_LORA_TARGET", "train.lora.targets",
     "\"q\" is not a gpt2 target; allowed: "
     "attn,proj,fc,fc2"},
    {"lora gpt2 target on llama",
     "{'model':{'family':'llama','preset':'tiny'}," DT ",'train':{'lora':{'targets':['fc']}}}", 0,
     422, "INVALID_LORA_TARGET", "train.lora.targets", "allowed: q,k,v,o,gate,up,down"},
    {"lora target twice", "{" MIN ",'train':{'lora':{'targets':['fc','fc']}}}", 0, 422,
     "INVALID_LORA_TARGET", "train.lora.targets", "twice"},
    {"lora no targets", "{" MIN ",'train':{'lora':{'targets':[]}}}", 0, 422, "OUT_OF_RANGE",
     "train.lora.targets", NULL},
    {"lora target not a string", "{" MIN ",'train':{'lora':{'targets':[1]}}}", 0, 422, "WRONG_TYPE",
     "train.lora.targets", "targets[0]"},
    {"lora unknown field", "{" MIN ",'train':{'lora':{'r':8}}}", 0, 422, "UNKNOWN_FIELD",
     "train.lora.r", NULL},
    {"lora not an object", "{" MIN ",'train':{'lora':true}}", 0, 422, "WRONG_TYPE", "train.lora",
     NULL},
    {"nf4 without lora", "{" MIN ",'train':{'quantize_base':'nf4'}}", 0, 422,
     "QUANTIZE_WITHOUT_LORA", "train.quantize_base", "nf4"},
    {"quantize int8", "{" MIN ",'train':{'quantize_base':'int8'}}", 0, 422, "INVALID_VALUE",
     "train.quantize_base", "none|nf4"},
    {"fp8 on cpu", "{" MIN ",'resources':{'device':'cpu'},'train':{'precision':'fp8'}}", 0, 422,
     "PRECISION_DEVICE", "train.precision", "precision=fp8"},
    {"precision fp16", "{" MIN ",'train':{'precision':'fp16'}}", 0, 422, "INVALID_VALUE",
     "train.precision", "bf16|fp32|fp8"},
    {"recompute budget 0", "{" MIN ",'train':{'recompute':{'budget_gib':0}}}", 0, 422,
     "OUT_OF_RANGE", "train.recompute.budget_gib", "budget_gib=0"},
    {"recompute object without budget", "{" MIN ",'train':{'recompute':{}}}", 0, 422,
     "MISSING_FIELD", "train.recompute", "budget_gib"},
    {"recompute unknown key", "{" MIN ",'train':{'recompute':{'budget':3}}}", 0, 422,
     "UNKNOWN_FIELD", "train.recompute.budget", NULL},
    {"recompute number", "{" MIN ",'train':{'recompute':3}}", 0, 422, "WRONG_TYPE",
     "train.recompute", "budget_gib"},
    {"recompute bad name", "{" MIN ",'train':{'recompute':'some'}}", 0, 422, "INVALID_VALUE",
     "train.recompute", "none|selective|full"},
    {"export lora without lora", "{" MIN ",'export':{'lora':true}}", 0, 422, "EXPORT_WITHOUT_LORA",
     "export.lora", NULL},
    {"export hf string", "{" MIN ",'export':{'hf':'yes'}}", 0, 422, "WRONG_TYPE", "export.hf",
     NULL},
    {"export unknown", "{" MIN ",'export':{'onnx':true}}", 0, 422, "UNKNOWN_FIELD", "export.onnx",
     NULL},
    {"gpu_type with space", "{" MIN ",'resources':{'gpu_type':'H100 SXM'}}", 0, 422,
     "INVALID_GPU_TYPE", "resources.gpu_type", "H100 SXM"},
    {"gpu_type empty list", "{" MIN ",'resources':{'gpu_type':[]}}", 0, 422, "OUT_OF_RANGE",
     "resources.gpu_type", NULL},
    {"gpu_type number", "{" MIN ",'resources':{'gpu_type':80}}", 0, 422, "WRONG_TYPE",
     "resources.gpu_type", "a string or a list of strings"},
    {"gpu_type list item bad", "{" MIN ",'resources':{'gpu_type':['A100','']}}", 0, 422,
     "INVALID_GPU_TYPE", "resources.gpu_type", "gpu_type[1]"},
    {"allow_mixed string", "{" MIN ",'resources':{'allow_mixed':'no'}}", 0, 422, "WRONG_TYPE",
     "resources.allow_mixed", NULL},
    {"pool with a space", "{" MIN ",'resources':{'pool':'gpu a'}}", 0, 422, "INVALID_VALUE",
     "resources.pool", "not a pool name"},
    {"pool number", "{" MIN ",'resources':{'pool':3}}", 0, 422, "WRONG_TYPE", "resources.pool",
     NULL},
    {"node labels not an object", "{" MIN ",'resources':{'labels':['zone=eu']}}", 0, 422,
     "WRONG_TYPE", "resources.labels", "object of strings"},
    {"node label value a number", "{" MIN ",'resources':{'labels':{'gpus':8}}}", 0, 422,
     "WRONG_TYPE", "resources.labels.gpus", NULL},
    {"node label key bad", "{" MIN ",'resources':{'labels':{'a b':'x'}}}", 0, 422, "INVALID_LABEL",
     "resources.labels.a b", NULL},
    {"too many node labels",
     "{" MIN ",'resources':{'labels':{'a':'1','b':'1','c':'1','d':'1','e':'1','f':'1','g':'1',"
     "'h':'1','i':'1'}}}",
     0, 422, "OUT_OF_RANGE", "resources.labels", "9 entries, at most 8"},
    {"max_runtime_s negative", "{" MIN ",'max_runtime_s':-1}", 0, 422, "OUT_OF_RANGE",
     "max_runtime_s", "-1"},
    {"max_runtime_s fraction", "{" MIN ",'max_runtime_s':1.5}", 0, 422, "WRONG_TYPE",
     "max_runtime_s", NULL},
    {"after a string", "{" MIN ",'after':'j-1'}", 0, 422, "WRONG_TYPE", "after", "list"},
    {"after bad id", "{" MIN ",'after':['j-1','bad id']}", 0, 422, "INVALID_JOB_ID", "after",
     "after[1]=\"bad id\""},
    {"preemptible number", "{" MIN ",'preemptible':1}", 0, 422, "WRONG_TYPE", "preemptible", NULL},
    {"array unknown key", "{" MIN ",'array':{'train.lrr':[1]}}", 0, 422, "INVALID_ARRAY_KEY",
     "array.train.lrr", "train.lrr"},
    {"array over a section", "{" MIN ",'array':{'train':[1]}}", 0, 422, "INVALID_ARRAY_KEY",
     "array.train", NULL},
    {"array over labels", "{" MIN ",'array':{'labels':[{}]}}", 0, 422, "INVALID_ARRAY_KEY",
     "array.labels", NULL},
    {"array no values", "{" MIN ",'array':{'train.lr':[]}}", 0, 422, "OUT_OF_RANGE",
     "array.train.lr", NULL},
    {"array value of the wrong type", "{" MIN ",'array':{'train.lr':[1e-4,'x']}}", 0, 422,
     "WRONG_TYPE", "array.train.lr", "array.train.lr[1]"},
    {"array value out of range", "{" MIN ",'array':{'parallel.zero_stage':[1,7]}}", 0, 422,
     "OUT_OF_RANGE", "array.parallel.zero_stage", "zero_stage[1]=7"},
    {"array not a list", "{" MIN ",'array':{'train.lr':1e-4}}", 0, 422, "WRONG_TYPE",
     "array.train.lr", NULL},
    {"array not an object", "{" MIN ",'array':[1]}", 0, 422, "WRONG_TYPE", "array", NULL},
    {"array member invalid",
     "{" MIN ",'train':{'steps':1000},'array':{'train.warmup_steps':"
     "[10,2000]}}",
     JOBSPEC_ARRAY_MEMBERS, 422, "WARMUP_TOO_LONG", "train.warmup_steps",
     "array member 1 (train.warmup_steps=2000)"},
    {"array too large",
     "{" MIN ",'array':{'train.seed':[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17],"
     "'train.warmup_steps':[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}}",
     0, 422, "ARRAY_TOO_LARGE", "array.train.warmup_steps", "256"},
};

static char *dequote(const char *s) {
    char *o = strdup(s);
    for (char *p = o; *p; p++)
        if (*p == '\'') *p = '"';
    return o;
}

static int run_case(const struct tcase *c, struct loom_spec *s) {
    char *text = dequote(c->spec);
    struct loom_error e;
    memset(&e, 0, sizeof e);
    int rc = jobspec_parse_text(s, text, strlen(text), c->flags, &e);
    int ok;
    if (c->status == 0) {
        ok = rc == 0;
        if (!ok)
            fprintf(stderr, "case '%s': expected valid, got %d %s at '%s': %s\n", c->what, e.status,
                    e.code, e.field, e.message);
    } else {
        ok = rc == -1 && e.status == c->status && strcmp(e.code, c->code) == 0 &&
             strcmp(e.field, c->field) == 0 && e.message[0] &&
             (!c->msg || strstr(e.message, c->msg));
        if (!ok)
            fprintf(stderr,
                    "case '%s': expected %d %s at '%s' (msg ~ '%s'), got rc=%d %d %s at "
                    "'%s': %s\n",
                    c->what, c->status, c->code, c->field, c->msg ? c->msg : "", rc, e.status,
                    e.code, e.field, e.message);
    }
    free(text);
    return ok;
}

static void test_table(void) {
    size_t n = sizeof cases / sizeof *cases;
    CHECK(n >= 40);
    size_t good = 0, bad = 0;
    for (size_t i = 0; i < n; i++) {
        struct loom_spec s;
        int ok = run_case(&cases[i], &s);
        CHECK(ok);
        if (!ok) continue;
        if (cases[i].status)
            bad++;
        else
            good++;
        if (cases[i].status != 0) continue;
        /* canonical round trip: dump, parse again, dump again: identical */
        char *a = jobspec_dumps(&s);
        struct loom_spec s2;
        struct loom_error e;
        /* members are checked on the body as submitted, not on the canonical form */
        unsigned rflags = cases[i].flags & ~JOBSPEC_ARRAY_MEMBERS;
        int rt = a ? jobspec_parse_text(&s2, a, strlen(a), rflags, &e) : -1;
        CHECK(rt == 0);
        if (rt != 0)
            fprintf(stderr, "round trip '%s': %s at '%s': %s\n%s\n", cases[i].what, e.code, e.field,
                    e.message, a ? a : "");
        char *b = jobspec_dumps(&s2);
        CHECK(a && b && strcmp(a, b) == 0);
        if (a && b && strcmp(a, b) != 0)
            fprintf(stderr, "round trip '%s':\n%s\n%s\n", cases[i].what, a, b);
        CHECK(memcmp(&s.model, &s2.model, sizeof s.model) == 0);
        CHECK(s.train.lr == s2.train.lr && s.train.seed == s2.train.seed &&
              s.n_labels == s2.n_labels);
        free(a);
        free(b);
    }
    printf("jobspec table: %zu valid, %zu invalid cases\n", good, bad);
}

static void test_defaults_and_derived(void) {
    struct loom_spec s;
    struct loom_error e;
    char *t = dequote("{" MIN "}");
    CHECK(jobspec_parse_text(&s, t, strlen(t), 0, &e) == 0);
    free(t);
    CHECK(strcmp(s.name, "gpt2-124m") == 0);
    CHECK(s.train.precision == JOBSPEC_PREC_BF16 && s.resources.device == JOBSPEC_DEV_CUDA);
    CHECK(fabs(s.train.min_lr - s.train.lr / 10) < 1e-18);
    char *canon = jobspec_dumps(&s);
    CHECK(canon && strstr(canon, "\"lr\":0.0006,") && strstr(canon, "\"min_lr\":6e-5,"));
    free(canon);
    CHECK(s.train.global_batch_tokens == 4 * 1024);
    CHECK(s.model.seq_len == 1024 && s.model.padded_vocab == 50304);
    CHECK(s.parallel.dp == 1 && s.parallel.zero_stage == 0 && s.priority == 50);

    t = dequote("{" MIN ",'parallel':{'dp':2},'train':{'micro_batch':16,"
                "'global_batch_tokens':524288,'steps':1000}}");
    CHECK(jobspec_parse_text(&s, t, strlen(t), 0, &e) == 0);
    free(t);
    struct jobspec_derived d;
    jobspec_derive(&s, &d);
    CHECK(d.world == 2 && d.nodes == 1 && d.grad_accum == 16 && d.tokens_per_micro == 16384);
    CHECK(d.sequences_per_step == 512 && d.tokens_total == 524288000LL);
    CHECK(d.n_params == model_n_params(&s.model) && d.flops_per_token > 6.0 * 1.2e8);
    json_t *dj = jobspec_derived_to_json(&d);
    CHECK(dj && json_integer_value(json_object_get(dj, "grad_accum")) == 16);
    json_decref(dj);

    /* 24 ranks with 8 per node need 3 nodes */
    t = dequote(
        "{'model':{'family':'llama','preset':'70b'}," DT
        ",'parallel':{'dp':3,'tp':8},'train':{'micro_batch':1,'global_batch_tokens':12288}}");
    CHECK(jobspec_parse_text(&s, t, strlen(t), 0, &e) == 0);
    free(t);
    jobspec_derive(&s, &d);
    CHECK(d.world == 24 && d.nodes == 3 && d.grad_accum == 1);

    /* labels sorted, canonical JSON carries every section */
    t = dequote("{" MIN ",'labels':{'z':'1','a':'2'}}");
    CHECK(jobspec_parse_text(&s, t, strlen(t), 0, &e) == 0);
    free(t);
    CHECK(s.n_labels == 2 && strcmp(s.labels[0].key, "a") == 0);
    json_t *j = jobspec_to_json(&s);
    const char *sections[] = {"name",  "labels",     "model",     "data",     "parallel",
                              "train", "checkpoint", "resources", "priority", "max_retries"};
    for (size_t i = 0; i < sizeof sections / sizeof *sections; i++)
        CHECK(json_object_get(j, sections[i]) != NULL);
    CHECK(json_integer_value(json_object_get(json_object_get(j, "model"), "n_layer")) == 12);
    json_decref(j);

    /* malformed text and duplicate keys are 400 */
    const char *bad[] = {"{\"model\":", "{\"a\":1,\"a\":2}", "", "{\"x\":\"\xff\"}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        memset(&e, 0, sizeof e);
        CHECK(jobspec_parse_text(&s, bad[i], strlen(bad[i]), 0, &e) == -1);
        CHECK(e.status == 400 && strcmp(e.code, "INVALID_JSON") == 0);
    }
    json_t *ej = loom_error_to_json(&e);
    CHECK(ej && strcmp(json_string_value(json_object_get(json_object_get(ej, "error"), "code")),
                       "INVALID_JSON") == 0);
    json_decref(ej);

    /* a NUL inside a string (a caller that loaded with JSON_ALLOW_NUL) */
    json_t *nul = json_pack("{s:{s:s,s:s},s:{s:s%}}", "model", "family", "gpt2", "preset", "124m",
                            "data", "train", "/a\0/etc/passwd", (size_t)14);
    CHECK(nul && jobspec_parse(&s, nul, 0, &e) == -1 && strcmp(e.code, "INVALID_VALUE") == 0 &&
          strcmp(e.field, "data.train") == 0);
    json_decref(nul);

    /* too many labels */
    json_t *big = json_pack("{s:{s:s,s:s},s:{s:s},s:{}}", "model", "family", "gpt2", "preset",
                            "124m", "data", "train", "/a.bin", "labels");
    for (int i = 0; i < JOBSPEC_LABELS_MAX + 1; i++) {
        char k[16];
        snprintf(k, sizeof k, "k%d", i);
        json_object_set_new(json_object_get(big, "labels"), k, json_string("v"));
    }
    CHECK(jobspec_parse(&s, big, 0, &e) == -1 && strcmp(e.code, "OUT_OF_RANGE") == 0 &&
          strcmp(e.field, "labels") == 0);
    json_decref(big);
}

/* The fine-tuning contract's fields land in the struct, take their
 * defaults when absent, and come out in the canonical form. */
static void test_finetune_fields(void) {
    struct loom_spec s;
    struct loom_error e;
    char *t = dequote("{" MIN "}");
    CHECK(jobspec_parse_text(&s, t, strlen(t), 0, &e) == 0);
    free(t);
    CHECK(s.init_from[0] == '\0' && s.data.format == JOBSPEC_FMT_BIN &&
          strcmp(s.data.text_key, "text") == 0 && s.data.val_fraction == 0 &&
          s.data.overlong == JOBSPEC_OVERLONG_TRUNCATE &&
          s.data.chat_template == JOBSPEC_CHAT_NONE);
    CHECK(s.train.loss_on == JOBSPEC_LOSS_ALL && s.train.packing == JOBSPEC_PACK_CONCAT &&
          !s.train.lora.enabled && s.train.quantize_base == JOBSPEC_QUANT_NONE &&
          s.train.recompute_budget_gib == 0);
    CHECK(!s.export.hf && !s.export.lora && s.resources.n_gpu_types == 0 &&
          !s.resources.allow_mixed && s.max_runtime_s == 0 && s.n_after == 0 && !s.preemptible &&
          s.n_array == 0 && jobspec_array_size(&s) == 1);
    json_t *j = jobspec_to_json(&s);
    json_t *data = json_object_get(j, "data");
    CHECK(strcmp(json_string_value(json_object_get(data, "format")), "bin") == 0);
    CHECK(json_object_get(data, "tokenizer") == NULL &&
          json_object_get(data, "chat_template") == NULL);
    CHECK(json_object_get(json_object_get(j, "train"), "lora") == NULL);
    CHECK(json_is_false(json_object_get(json_object_get(j, "export"), "hf")));
    json_decref(j);

    t = dequote(FT_EXAMPLE);
    json_t *body = json_loads(t, 0, NULL);
    free(t);
    CHECK(body && jobspec_parse(&s, body, JOBSPEC_ARRAY_MEMBERS, &e) == 0);
    CHECK(strcmp(s.init_from, "/data/models/Llama-3.2-1B") == 0);
    CHECK(s.data.format == JOBSPEC_FMT_CHAT && s.data.chat_template == JOBSPEC_CHAT_LLAMA3 &&
          strcmp(s.data.tokenizer, "/data/models/Llama-3.2-1B") == 0 &&
          fabs(s.data.val_fraction - 0.01) < 1e-15);
    CHECK(s.train.loss_on == JOBSPEC_LOSS_ASSISTANT && s.train.packing == JOBSPEC_PACK_DOCUMENT);
    CHECK(s.train.lora.enabled && s.train.lora.rank == 16 && s.train.lora.alpha == 32 &&
          s.train.lora.dropout == 0 && s.train.lora.n_targets == 7 &&
          strcmp(s.train.lora.targets[4], "gate") == 0);
    CHECK(s.train.quantize_base == JOBSPEC_QUANT_NF4 && s.train.recompute_budget_gib == 20);
    CHECK(s.export.hf && s.export.lora && s.resources.n_gpu_types == 1 &&
          strcmp(s.resources.gpu_type[0], "H100-SXM") == 0 && !s.resources.allow_mixed);
    CHECK(strcmp(s.resources.pool, "train") == 0 && s.resources.n_node_labels == 1 &&
          strcmp(s.resources.node_labels[0].key, "zone") == 0 &&
          strcmp(s.resources.node_labels[0].value, "eu") == 0 && s.n_labels == 0);
    CHECK(s.max_runtime_s == 86400 && s.n_after == 1 && strcmp(s.after[0], "j-d1b9522f5b1a") == 0 &&
          s.preemptible);
    CHECK(s.n_array == 1 && strcmp(s.array[0].key, "train.lr") == 0 && s.array[0].n_values == 2);
    /* array members: the body with each value set, "array" removed */
    CHECK(jobspec_array_size(&s) == 2);
    json_t *m1 = jobspec_array_member(&s, body, 1);
    CHECK(m1 && json_object_get(m1, "array") == NULL &&
          fabs(json_number_value(json_object_get(json_object_get(m1, "train"), "lr")) - 3e-4) <
              1e-18);
    CHECK(jobspec_array_member(&s, body, 2) == NULL);
    struct loom_spec ms;
    CHECK(m1 && jobspec_parse(&ms, m1, 0, &e) == 0 && ms.train.lr == 3e-4 && ms.n_array == 0 &&
          ms.train.lora.enabled);
    json_decref(m1);
    json_decref(body);
    j = jobspec_to_json(&s);
    json_t *tr = json_object_get(j, "train");
    CHECK(json_number_value(json_object_get(json_object_get(tr, "recompute"), "budget_gib")) == 20);
    CHECK(json_array_size(json_object_get(json_object_get(tr, "lora"), "targets")) == 7);
    CHECK(json_is_array(json_object_get(json_object_get(j, "resources"), "gpu_type")));
    CHECK(json_array_size(json_object_get(json_object_get(j, "array"), "train.lr")) == 2);
    json_decref(j);

    /* members vary the last key fastest; keys are sorted */
    t = dequote("{" MIN ",'array':{'train.seed':[7,8,9],'parallel.zero_stage':[0,1]}}");
    body = json_loads(t, 0, NULL);
    free(t);
    CHECK(jobspec_parse(&s, body, JOBSPEC_ARRAY_MEMBERS, &e) == 0 && jobspec_array_size(&s) == 6);
    CHECK(strcmp(s.array[0].key, "parallel.zero_stage") == 0);
    json_t *m4 = jobspec_array_member(&s, body, 4); /* zero_stage=1, seed=8 */
    CHECK(m4 &&
          json_integer_value(json_object_get(json_object_get(m4, "parallel"), "zero_stage")) == 1 &&
          json_integer_value(json_object_get(json_object_get(m4, "train"), "seed")) == 8);
    json_decref(m4);
    json_decref(body);

    /* gpt2 targets come out in the family's order; default targets: all */
    t = dequote("{" MIN ",'train':{'lora':{'targets':['fc2','attn']}}}");
    CHECK(jobspec_parse_text(&s, t, strlen(t), 0, &e) == 0);
    free(t);
    CHECK(s.train.lora.n_targets == 2 && strcmp(s.train.lora.targets[0], "attn") == 0 &&
          strcmp(s.train.lora.targets[1], "fc2") == 0);
    t = dequote("{" MIN ",'train':{'lora':{}}}");
    CHECK(jobspec_parse_text(&s, t, strlen(t), 0, &e) == 0);
    free(t);
    CHECK(s.train.lora.enabled && s.train.lora.n_targets == 4 && s.train.lora.rank == 16);

    /* a validator run on a filled struct catches what parsing would */
    jobspec_init(&s);
    t = dequote("{" MIN "}");
    CHECK(jobspec_parse_text(&s, t, strlen(t), 0, &e) == 0);
    free(t);
    s.train.lora.enabled = 1;
    s.train.lora.n_targets = 1;
    snprintf(s.train.lora.targets[0], sizeof s.train.lora.targets[0], "q");
    CHECK(jobspec_validate(&s, 0, &e) == -1 && strcmp(e.code, "INVALID_LORA_TARGET") == 0);
}

static void poke_lr(struct loom_spec *s) {
    s->train.lr = 0;
}
static void poke_keep(struct loom_spec *s) {
    s->checkpoint.keep = 0;
}
static void poke_schedule(struct loom_spec *s) {
    s->train.schedule = (enum jobspec_schedule)9;
}
static void poke_dropout(struct loom_spec *s) {
    s->train.lora.enabled = 1;
    s->train.lora.dropout = 1;
}
static void poke_gpu_type(struct loom_spec *s) {
    s->resources.n_gpu_types = 1;
    snprintf(s->resources.gpu_type[0], sizeof s->resources.gpu_type[0], "a b");
}

/* The field table is well formed and is what init, parse, validate and the
 * canonical form use: every row's default is what jobspec_init sets, every
 * present row appears in the canonical JSON, and validate applies the rows'
 * ranges to a spec filled by hand. */
static void test_field_table(void) {
    size_t n;
    const struct jobspec_field *f = jobspec_fields(&n);
    CHECK(n >= 75);
    struct loom_spec s;
    jobspec_init(&s);
    for (size_t i = 0; i < n; i++) {
        const char *dot = strrchr(f[i].path, '.');
        if (dot) { /* its section is an earlier row */
            char parent[64];
            snprintf(parent, sizeof parent, "%.*s", (int)(dot - f[i].path), f[i].path);
            const struct jobspec_field *p = jobspec_field_find(parent);
            CHECK(p && p < &f[i] &&
                  (p->type == JOBSPEC_F_OBJ ||
                   (p->type == JOBSPEC_F_RECOMPUTE && (f[i].flags & JOBSPEC_FL_INNER))));
        }
        CHECK(jobspec_field_find(f[i].path) == &f[i]); /* paths are unique */
        CHECK(f[i].help && f[i].help[0]);
        const char *p = (const char *)&s + f[i].off;
        switch (f[i].type) {
        case JOBSPEC_F_I32:
            CHECK(*(const int *)p == (int)f[i].def);
            break;
        case JOBSPEC_F_I64:
            CHECK(*(const int64_t *)p == (int64_t)f[i].def);
            break;
        case JOBSPEC_F_DBL:
            CHECK(*(const double *)p == f[i].def);
            break;
        case JOBSPEC_F_ENUM: {
            int k = 0;
            while (f[i].names[k])
                k++;
            CHECK(f[i].def >= 0 && f[i].def < k && *(const int *)p == (int)f[i].def);
            break;
        }
        case JOBSPEC_F_STR:
            CHECK(f[i].size > 1 && strcmp(p, f[i].def_s ? f[i].def_s : "") == 0);
            break;
        case JOBSPEC_F_STRLIST:
            CHECK(f[i].size > 1 && f[i].max_count >= 1);
            break;
        default:
            break;
        }
    }
    /* the contract example sets every optional row: all appear in its
     * canonical form */
    struct loom_error e;
    char *t = dequote(FT_EXAMPLE);
    CHECK(jobspec_parse_text(&s, t, strlen(t), 0, &e) == 0);
    free(t);
    json_t *j = jobspec_to_json(&s);
    for (size_t i = 0; i < n; i++) {
        if (f[i].flags & JOBSPEC_FL_INNER) continue;
        if (strcmp(f[i].path, "model.rope_theta") == 0 || strcmp(f[i].path, "data.val") == 0)
            continue; /* a llama with val_fraction: both absent by rule */
        if (strncmp(f[i].path, "model.init_", 11) == 0 && strcmp(f[i].path, "model.init_from"))
            continue; /* loomd sets them for a job: init_from (the example's is a directory) */
        const json_t *v = j;
        char path[64];
        snprintf(path, sizeof path, "%s", f[i].path);
        for (char *seg = path, *dot; v; seg = dot + 1) {
            dot = strchr(seg, '.');
            if (dot) *dot = '\0';
            v = json_object_get(v, seg);
            if (!dot) break;
        }
        if (!v) fprintf(stderr, "canonical form lacks %s\n", f[i].path);
        CHECK(v != NULL);
    }
    json_decref(j);
    /* validate applies the rows' ranges and names to a struct filled by hand */
    struct {
        const char *what;
        void (*poke)(struct loom_spec *);
        const char *code, *field;
    } pokes[] = {
        {"lr 0", poke_lr, "OUT_OF_RANGE", "train.lr"},
        {"keep 0", poke_keep, "OUT_OF_RANGE", "checkpoint.keep"},
        {"schedule 9", poke_schedule, "INVALID_VALUE", "train.schedule"},
        {"dropout 1", poke_dropout, "OUT_OF_RANGE", "train.lora.dropout"},
        {"gpu type", poke_gpu_type, "INVALID_GPU_TYPE", "resources.gpu_type"},
    };
    for (size_t i = 0; i < sizeof pokes / sizeof *pokes; i++) {
        t = dequote("{" MIN "}");
        CHECK(jobspec_parse_text(&s, t, strlen(t), 0, &e) == 0);
        free(t);
        pokes[i].poke(&s);
        memset(&e, 0, sizeof e);
        int ok = jobspec_validate(&s, 0, &e) == -1 && strcmp(e.code, pokes[i].code) == 0 &&
                 strcmp(e.field, pokes[i].field) == 0;
        if (!ok) fprintf(stderr, "poke '%s': %s at %s\n", pokes[i].what, e.code, e.field);
        CHECK(ok);
    }
}

struct pcase {
    const char *what;
    const char *rel; /* path relative to the temp dir */
    unsigned flags;
    const char *code; /* NULL: allowed */
};

static const struct pcase pcases[] = {
    {"glob inside root", "root/data/a_*.bin", JOBSPEC_PATH_MUST_EXIST, NULL},
    {"single file", "root/data/a_1.bin", JOBSPEC_PATH_MUST_EXIST, NULL},
    {"no match, must exist", "root/data/zz_*.bin", JOBSPEC_PATH_MUST_EXIST, "DATA_PATH_NOT_FOUND"},
    {"no match, lenient", "root/data/zz_*.bin", 0, NULL},
    {"outside", "outside/secret.bin", 0, "DATA_PATH_FORBIDDEN"},
    {"file symlink out", "root/data/evil.bin", 0, "DATA_PATH_FORBIDDEN"},
    {"glob catches symlink out", "root/data/*.bin", 0, "DATA_PATH_FORBIDDEN"},
    {"dir symlink out", "root/link/secret.bin", 0, "DATA_PATH_FORBIDDEN"},
    {"missing dir under symlink out", "root/link/none/x.bin", 0, "DATA_PATH_FORBIDDEN"},
    {"missing dir inside root", "root/newdir/x.bin", 0, NULL},
    {"missing dir, must exist", "root/newdir/x.bin", JOBSPEC_PATH_MUST_EXIST,
     "DATA_PATH_NOT_FOUND"},
    {"dot-dot", "root/../outside/secret.bin", 0, "DATA_PATH_INVALID"},
    {"sibling with root as prefix", "root2/a.bin", 0, "DATA_PATH_FORBIDDEN"},
    {"symlink inside root to inside", "root/data/good.bin", JOBSPEC_PATH_MUST_EXIST, NULL},
};

static void touch(const char *path) {
    FILE *f = fopen(path, "w");
    if (f) fclose(f);
}

static void test_paths(void) {
    char tmpl[] = "/tmp/loom_jobspec_XXXXXX";
    char *dir = mkdtemp(tmpl);
    CHECK(dir != NULL);
    if (!dir) return;
    char p[PATH_MAX], q[PATH_MAX];
#define P(...) (snprintf(p, sizeof p, __VA_ARGS__), p)
#define Q(...) (snprintf(q, sizeof q, __VA_ARGS__), q)
    mkdir(P("%s/root", dir), 0755);
    mkdir(P("%s/root/data", dir), 0755);
    mkdir(P("%s/outside", dir), 0755);
    mkdir(P("%s/root2", dir), 0755);
    touch(P("%s/root/data/a_1.bin", dir));
    touch(P("%s/root/data/a_2.bin", dir));
    touch(P("%s/outside/secret.bin", dir));
    touch(P("%s/root2/a.bin", dir));
    CHECK(symlink(Q("%s/outside/secret.bin", dir), P("%s/root/data/evil.bin", dir)) == 0);
    CHECK(symlink(Q("%s/outside", dir), P("%s/root/link", dir)) == 0);
    CHECK(symlink("a_1.bin", P("%s/root/data/good.bin", dir)) == 0);

    char root[PATH_MAX], root_slash[PATH_MAX];
    snprintf(root, sizeof root, "%s/root", dir);
    snprintf(root_slash, sizeof root_slash, "%s/root/", dir);
    const char *roots[] = {"/nonexistent/elsewhere", root};
    for (size_t i = 0; i < sizeof pcases / sizeof *pcases; i++) {
        struct loom_error e;
        memset(&e, 0, sizeof e);
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, pcases[i].rel);
        int rc = jobspec_path_confined(path, roots, 2, pcases[i].flags, "data.train", &e);
        int ok = pcases[i].code ? (rc == -1 && strcmp(e.code, pcases[i].code) == 0 &&
                                   strcmp(e.field, "data.train") == 0)
                                : rc == 0;
        if (!ok)
            fprintf(stderr, "path case '%s': rc=%d %s %s\n", pcases[i].what, rc, e.code, e.message);
        CHECK(ok);
    }
    /* a root written with a trailing slash works; no roots refuses */
    struct loom_error e;
    const char *r2[] = {root_slash};
    CHECK(jobspec_path_confined(P("%s/root/data/a_1.bin", dir), r2, 1, JOBSPEC_PATH_MUST_EXIST,
                                "data.val", &e) == 0);
    CHECK(jobspec_path_confined(P("%s/root/data/a_1.bin", dir), r2, 0, 0, "data.val", &e) == -1 &&
          strcmp(e.code, "DATA_PATH_FORBIDDEN") == 0 && strcmp(e.field, "data.val") == 0);

    /* jobspec_check_paths on a parsed spec checks both train and val */
    struct loom_spec s;
    jobspec_init(&s);
    snprintf(s.data.train, sizeof s.data.train, "%s/root/data/a_*.bin", dir);
    snprintf(s.data.val, sizeof s.data.val, "%s/outside/secret.bin", dir);
    CHECK(jobspec_check_paths(&s, roots, 2, 0, &e) == -1 && strcmp(e.field, "data.val") == 0);
    s.data.val[0] = '\0';
    CHECK(jobspec_check_paths(&s, roots, 2, JOBSPEC_PATH_MUST_EXIST, &e) == 0);
    /* ... and data.tokenizer and a model.init_from directory, not a job:<id> */
    snprintf(s.data.tokenizer, sizeof s.data.tokenizer, "%s/outside/secret.bin", dir);
    CHECK(jobspec_check_paths(&s, roots, 2, 0, &e) == -1 &&
          strcmp(e.field, "data.tokenizer") == 0 && strcmp(e.code, "DATA_PATH_FORBIDDEN") == 0);
    s.data.tokenizer[0] = '\0';
    snprintf(s.init_from, sizeof s.init_from, "%s/outside", dir);
    CHECK(jobspec_check_paths(&s, roots, 2, 0, &e) == -1 &&
          strcmp(e.field, "model.init_from") == 0);
    snprintf(s.init_from, sizeof s.init_from, "%s/root/data", dir);
    CHECK(jobspec_check_paths(&s, roots, 2, JOBSPEC_PATH_MUST_EXIST, &e) == 0);
    snprintf(s.init_from, sizeof s.init_from, "job:j-1@5");
    CHECK(jobspec_check_paths(&s, roots, 2, 0, &e) == 0);

    unlink(P("%s/root/data/good.bin", dir));
    unlink(P("%s/root/data/evil.bin", dir));
    unlink(P("%s/root/link", dir));
    unlink(P("%s/root/data/a_1.bin", dir));
    unlink(P("%s/root/data/a_2.bin", dir));
    unlink(P("%s/outside/secret.bin", dir));
    unlink(P("%s/root2/a.bin", dir));
    rmdir(P("%s/root/data", dir));
    rmdir(P("%s/root", dir));
    rmdir(P("%s/outside", dir));
    rmdir(P("%s/root2", dir));
    rmdir(dir);
#undef P
#undef Q
}

/* Deterministic mutations of a full spec (byte flips, truncation, numbers
 * made huge or negative, keys renamed): the parser must answer every one with
 * success or a coded error, never crash (run under ASan in the sanitizer
 * build). */
static void test_mutations(const char *spec, unsigned flags) {
    char *base = dequote(spec);
    size_t len = strlen(base);
    char *buf = malloc(len + 32);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    int ok = 0, err = 0;
    static const char repl[] = "\"{}[]:,0-9e.aZ\\\x01\xff";
    for (int it = 0; it < 3000; it++) {
        memcpy(buf, base, len + 1);
        size_t n = len;
        int edits = 1 + it % 4;
        for (int k = 0; k < edits; k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            size_t pos = (size_t)(x % n);
            switch ((x >> 32) % 4) {
            case 0:
                buf[pos] = repl[(x >> 40) % (sizeof repl - 1)];
                break;
            case 1:
                n = pos; /* truncate */
                buf[n] = '\0';
                break;
            case 2:
                if (buf[pos] >= '0' && buf[pos] <= '9' && n + 12 < len + 32) {
                    memmove(buf + pos + 12, buf + pos, n - pos + 1);
                    memcpy(buf + pos, "999999999999", 12);
                    n += 12;
                }
                break;
            default:
                if (buf[pos] >= 'a' && buf[pos] <= 'z') buf[pos] = (char)('a' + (x >> 48) % 26);
                break;
            }
            if (n == 0) break;
        }
        struct loom_spec s;
        struct loom_error e;
        memset(&e, 0, sizeof e);
        int rc = jobspec_parse_text(&s, buf, n, flags, &e);
        if (rc == 0) {
            ok++;
            char *d = jobspec_dumps(&s);
            CHECK(d != NULL);
            free(d);
        } else {
            err++;
            CHECK((e.status == 400 || e.status == 422) && e.code[0] && e.message[0]);
        }
    }
    CHECK(err > 1000);
    printf("mutations: %d accepted, %d rejected with a code\n", ok, err);
    free(buf);
    free(base);
}

int main(void) {
    test_table();
    test_mutations(cases[1].spec, 0);
    /* the fine-tuning fields: lists, LoRA, recompute objects, array members */
    test_mutations(FT_EXAMPLE, JOBSPEC_ARRAY_MEMBERS);
    test_defaults_and_derived();
    test_finetune_fields();
    test_field_table();
    test_paths();
    return check_summary("test_jobspec");
}

/* Chat templates (tokenizer.h): tokenizer.chat_template is recognised by the substrings llama.cpp's
 * llm_chat_detect_template looks for, in its order, and only chatml, gemma and llama3 are rendered;
 * any template llama.cpp would take for another format is "not recognised" here rather than guessed. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"

static int has(const char *t, size_t n, const char *needle) {
    size_t k = strlen(needle);
    if (k > n) return 0;
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(t + i, needle, k) == 0) return 1;
    return 0;
}

tok_chat tok_chat_detect(const char *t, size_t n) {
    if (has(t, n, "<|im_start|>"))
        return has(t, n, "<|im_sep|>") || has(t, n, "<end_of_utterance>") ? TOK_CHAT_NONE : TOK_CHAT_CHATML;
    if ((n >= 7 && memcmp(t, "mistral", 7) == 0) || has(t, n, "[INST]")) return TOK_CHAT_NONE;
    if ((has(t, n, "<|assistant|>") && (has(t, n, "<|end|>") || has(t, n, "<|user|>"))) || has(t, n, "[gMASK]<sop>") ||
        (has(t, n, "<|{{ item['role'] }}|>") && has(t, n, "<|begin_of_image|>")) ||
        (has(t, n, "<|user|>") && has(t, n, "<|endoftext|>")) || has(t, n, "bos_token + message['role']"))
        return TOK_CHAT_NONE;
    if (has(t, n, "<start_of_turn>")) return TOK_CHAT_GEMMA;
    if (has(t, n, "'\\n\\nAssistant: ' + eos_token") || has(t, n, "GPT4 Correct ") ||
        (has(t, n, "USER: ") && has(t, n, "ASSISTANT: ")) || (has(t, n, "### Instruction:") && has(t, n, "<|EOT|>")) ||
        (has(t, n, "<|START_OF_TURN_TOKEN|>") && has(t, n, "<|USER_TOKEN|>")))
        return TOK_CHAT_NONE;
    if (has(t, n, "<|start_header_id|>") && has(t, n, "<|end_header_id|>")) return TOK_CHAT_LLAMA3;
    return TOK_CHAT_NONE;
}

const char *tok_chat_name(tok_chat c) {
    switch (c) {
    case TOK_CHAT_CHATML: return "chatml";
    case TOK_CHAT_GEMMA: return "gemma";
    case TOK_CHAT_LLAMA3: return "llama3";
    default: return "none";
    }
}

int tok_chat_wrap(const bmoe_tokenizer *tk, const char *prompt, char **out, char *err, size_t errlen) {
    *out = NULL;
    const char *pre, *post;
    size_t b = 0, e = strlen(prompt);
    switch (tk->chat) {
    case TOK_CHAT_CHATML: /* the content as given */
        pre = "<|im_start|>user\n";
        post = "<|im_end|>\n<|im_start|>assistant\n";
        break;
    case TOK_CHAT_GEMMA:
        pre = "<start_of_turn>user\n";
        post = "<end_of_turn>\n<start_of_turn>model\n";
        goto trim;
    case TOK_CHAT_LLAMA3:
        pre = "<|start_header_id|>user<|end_header_id|>\n\n";
        post = "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
    trim: /* these two templates trim the content's ASCII white space */
        while (b < e && isspace((unsigned char)prompt[b])) b++;
        while (e > b && isspace((unsigned char)prompt[e - 1])) e--;
        break;
    default:
        snprintf(err, errlen, "--chat: the model has no chat template this engine recognises (chatml, gemma, llama3)");
        return 2;
    }
    size_t lp = strlen(pre), lq = strlen(post);
    char *s = malloc(lp + (e - b) + lq + 1);
    if (!s) return -3;
    memcpy(s, pre, lp);
    memcpy(s + lp, prompt + b, e - b);
    memcpy(s + lp + (e - b), post, lq + 1);
    *out = s;
    return 0;
}

/**
 * The tokenizer against llama.cpp's own outputs on the compat GGUF files
 * (../shared/models/compat/*.llama_cpp.json, written by make_fixtures.py with llama-server):
 * prompt ids for every prompt of every file, chat-template ids, the end-of-generation set, and
 * llama.cpp's text for the ids it generated. Only the vocabulary is read (the GGUF header), so
 * this holds whether or not the weights of a file load.
 */
import { assert, assertEquals } from "@std/assert";
import { readGgufHeader } from "../lib/model/gguf.ts";
import { ggufTokenizerData } from "../lib/model/gguf_tokenizer.ts";
import { createChatRenderer } from "../lib/chat/chat_template.ts";
import { Tokenizer } from "../lib/tokenizer/tokenizer.ts";
import { modelFile } from "./harness/model_files.ts";

interface Fixture {
  model: { file: string; gguf: Record<string, unknown> };
  llama_cpp: { special_tokens: { eog_ids: number[]; bos_id?: number } };
  prompts: {
    prompt: string;
    prompt_ids: number[];
    prompt_ids_parse_special?: number[];
    bos_added: boolean;
    completion_ids: number[];
    completion_text: string;
  }[];
  chat?: {
    messages: { role: "system" | "user" | "assistant"; content: string }[];
    apply_template_prompt: string;
    template_ids: number[];
    chat_completion_ids: number[];
    chat_completion_text: string;
  };
}

const dir = modelFile("compat");
const names = [...Deno.readDirSync(dir)].map((e) => e.name).filter((n) =>
  n.endsWith(".llama_cpp.json")
).sort();
// The folder's README lists nine files; fewer means the mirror is incomplete, not a pass.
assert(names.length >= 9, `expected the 9 compat fixtures in ${dir}, found ${names.length}`);

const loaded = new Map<string, Promise<{ fx: Fixture; tok: Tokenizer; template?: string }>>();
function load(name: string) {
  let p = loaded.get(name);
  if (!p) {
    p = (async () => {
      const fx = JSON.parse(await Deno.readTextFile(`${dir}/${name}`)) as Fixture;
      const header = await readGgufHeader(`${dir}/${fx.model.file}`);
      const data = ggufTokenizerData(header.metadata, fx.model.file);
      assert(data, `${fx.model.file} has a vocabulary`);
      const template = header.metadata.get("tokenizer.chat_template")?.value;
      return {
        fx,
        tok: new Tokenizer(data!),
        ...(typeof template === "string" ? { template } : {}),
      };
    })();
    loaded.set(name, p);
  }
  return p;
}

for (const name of names) {
  const label = name.replace(".llama_cpp.json", "");

  Deno.test(`${label}: every fixture prompt encodes to llama.cpp's ids (BOS as the file says)`, async () => {
    const { fx, tok } = await load(name);
    // bos_added is derived from print_info's bos_id, which two stories fixtures lack.
    const bosKnown = fx.llama_cpp.special_tokens.bos_id !== undefined;
    for (const p of fx.prompts) {
      assertEquals(tok.encode(p.prompt), p.prompt_ids, JSON.stringify(p.prompt));
      if (bosKnown) assertEquals(tok.addBos, p.bos_added, "add_bos_token");
      if (p.prompt_ids_parse_special) {
        assertEquals(tok.encode(p.prompt, { special: true }), p.prompt_ids_parse_special);
      }
    }
  });

  Deno.test(`${label}: llama.cpp's generated ids decode to its text, whole and streamed`, async () => {
    const { fx, tok } = await load(name);
    const runs = fx.prompts.map((p) => [p.completion_ids, p.completion_text] as const);
    if (fx.chat) runs.push([fx.chat.chat_completion_ids, fx.chat.chat_completion_text]);
    for (const [ids, text] of runs) {
      assertEquals(tok.decode(ids), text);
      const dec = tok.createDecoder();
      const pieces = ids.map((id) => dec.push(id));
      pieces.push(dec.flush());
      assertEquals(pieces.join(""), text);
      assert(
        !pieces.some((s) => s.includes("\uFFFD") && !text.includes("\uFFFD")),
        "no split character",
      );
    }
  });

  Deno.test(`${label}: the end-of-generation set is llama.cpp's`, async () => {
    const { fx, tok } = await load(name);
    const special = fx.llama_cpp.special_tokens;
    // Two stories fixtures lost llama.cpp's print_info lines (no bos_id either): nothing to compare there.
    if (special.bos_id === undefined) {
      assertEquals([...tok.eogIds], [tok.eosId], "EOS alone, as in stories260K-bf16's fixture");
      return;
    }
    assertEquals([...tok.eogIds].sort((a, b) => a - b), [...special.eog_ids].sort((a, b) => a - b));
    for (const id of tok.eogIds) assertEquals(tok.decode([id]), "", `EOG ${id} prints nothing`);
  });

  Deno.test(`${label}: the model's chat template gives llama.cpp's prompt text and ids`, async () => {
    const { fx, tok, template } = await load(name);
    if (!fx.chat) {
      assertEquals(template, undefined, "no chat fixture means no template in the file");
      return;
    }
    assert(template, "the file carries its chat template");
    const render = createChatRenderer({
      template,
      bosToken: tok.tokenText(tok.bosId),
      eosToken: tok.tokenText(tok.eosId),
      specialTokens: tok.specialPieces,
    });
    const rendered = render(fx.chat.messages);
    assertEquals(rendered.special, true);
    const ids = tok.encodeTemplate(rendered.prompt);
    assertEquals(ids, fx.chat.template_ids);
    assertEquals(
      ids.filter((id) => id === tok.bosId && tok.addBos).length,
      tok.addBos ? 1 : 0,
      "one BOS",
    );
    // llama.cpp's /apply-template text, which it drops a leading BOS text from:
    assertEquals(tok.encodeTemplate(fx.chat.apply_template_prompt), fx.chat.template_ids);
  });
}

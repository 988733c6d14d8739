"""normrank as a LangChain vector store: a RAG chain, MMR, the indexing API and safe persistence.

Runs offline on the bundled model; the chat model is LangChain's ParrotFakeChatModel (it answers
with its prompt), so the output shows exactly the context the retriever handed over, in order.
"""

import tempfile

from langchain_core.documents import Document
from langchain_core.indexing import InMemoryRecordManager, index
from langchain_core.language_models.fake_chat_models import ParrotFakeChatModel
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough

from langchain_normrank import NormRankVectorStore
from normrank import Weights

docs = [
    Document(page_content="Photosynthesis turns light, water and carbon dioxide into sugar in green plants.",
             metadata={"source": "biology"}, id="photo"),
    Document(page_content="Chlorophyll absorbs red and blue light and reflects green.",
             metadata={"source": "biology"}, id="chloro"),
    Document(page_content="Mitochondria produce most of the chemical energy a cell needs.",
             metadata={"source": "biology"}, id="mito"),
    Document(page_content="The Eiffel Tower is a wrought-iron lattice tower in Paris.",
             metadata={"source": "travel"}, id="eiffel"),
]
store = NormRankVectorStore(weights=Weights(a=0.02))  # raw MiniLM embeddings by default
record_manager = InMemoryRecordManager("normrank/example")
record_manager.create_schema()
print(index(docs, record_manager, store, cleanup="incremental", source_id_key="source", key_encoder="sha256"))
print(index(docs, record_manager, store, cleanup="incremental", source_id_key="source", key_encoder="sha256"))

question = "How do plants turn light into energy?"
for doc, score in store.similarity_search_with_score(question, k=2, filter={"source": "biology"}):
    why = doc.metadata["normrank"]
    print(f"{score:.3f} (cos {why['cosine']:.3f}, g(d) {why['norm_feature']:+.2f})  {doc.page_content}")
mmr = store.max_marginal_relevance_search(question, k=2, fetch_k=4, lambda_mult=0.3)
print("mmr:", [d.page_content[:30] for d in mmr])

prompt = ChatPromptTemplate.from_messages([("human", "Context:\n{context}\n\nQuestion: {question}")])
chain = ({"context": store.as_retriever(search_kwargs={"k": 2})
          | (lambda ds: "\n".join(f"- {d.page_content}" for d in ds)),
          "question": RunnablePassthrough()}
         | prompt | ParrotFakeChatModel() | StrOutputParser())
print(chain.invoke(question))

with tempfile.TemporaryDirectory() as folder:
    store.save_local(folder)  # FAISS + JSON + NumPy, checksummed; never pickle
    again = NormRankVectorStore.load_local(folder)
    print("reloaded:", [d.page_content[:30] for d in again.similarity_search(question, k=2)])
